"""Make the passwords the rendered configs expect: one per user, in the two shapes needed.

    python -m deploy.nats.secrets --out deploy/secrets [--nodes node1,node2] [--teams vision,nlp]

writes (directory 0700, files 0600, never committed: deploy/.gitignore):

- `nats-users.env`: `CORRAL_<USER>_PASSWORD=...` lines, the servers' environment
  (docker compose `env_file`, `kubectl create secret generic --from-env-file`).
- `<user>.password`: the same password alone, for that user's `--password-file`
  (compose `secrets:`, a Kubernetes Secret, or a file an agent's node is
  provisioned with).

Existing files are kept (rotating a password is a deliberate act: delete the
file, rerun, restart the server and that user's service); a kept password that
nats-server would refuse is named on stderr.

Why letters and digits only, a letter first: nats-server parses an environment
variable's value as a config value, not as a string. A value starting with `-`
or a digit is lexed as a number or an ISO 8601 date ("Expected a digit", "All
ISO8601 dates must be in full Zulu form"), `true`/`no`/`on` become booleans,
and `#`, `;`, `,`, `}` or `]` end the value early. A letter first makes it an
unquoted string; letters and digits cannot end it. 32 characters from 62 give
about 190 bits.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import string
import sys
from collections.abc import Sequence
from pathlib import Path

from deploy.nats.render import DEPLOY, EXAMPLE_NODES, EXAMPLE_TEAMS, password_env, users

#: Length of a generated password (a letter, then letters and digits).
PASSWORD_LENGTH = 32
_LETTERS = string.ascii_letters
_ALNUM = string.ascii_letters + string.digits
#: The values nats-server reads from the environment as the very string they are (see the module doc).
_NATS_STRING = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_NATS_KEYWORDS = frozenset({"true", "false", "yes", "no", "on", "off"})


def new_password(length: int = PASSWORD_LENGTH) -> str:
    """A random password nats-server parses as a string: a letter, then letters and digits."""
    return secrets.choice(_LETTERS) + "".join(secrets.choice(_ALNUM) for _ in range(length - 1))


def nats_reads_as_string(value: str) -> bool:
    """Whether nats-server reads this environment value back as the same string (not a number,
    date, boolean, or a value cut short)."""
    return _NATS_STRING.fullmatch(value) is not None and value.lower() not in _NATS_KEYWORDS


def write_secrets(out: Path, nodes: Sequence[str], teams: Sequence[str] = ()) -> dict[str, str]:
    """Write (or keep) every user's password; returns env var -> password."""
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    names = [u for u, _, _ in users(nodes, teams)] + ["sys"]
    env: dict[str, str] = {}
    for user in names:
        path = out / f"{user}.password"
        if not path.exists():
            _write_private(path, new_password() + "\n")
        password = path.read_text().splitlines()[0]
        if not nats_reads_as_string(password):
            print(f"warning: {path} is kept, but nats-server may refuse it or read it as something else than "
                  "this string (it parses environment values as config values): delete the file and rerun "
                  "to make a new one", file=sys.stderr)
        env[password_env(user)] = password
    _write_private(out / "nats-users.env", "".join(f"{k}={v}\n" for k, v in env.items()))
    return env


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEPLOY / "secrets")
    ap.add_argument("--nodes", default=",".join(EXAMPLE_NODES), help="comma-separated node ids")
    ap.add_argument("--teams", default=",".join(EXAMPLE_TEAMS), help="comma-separated teams")
    args = ap.parse_args(argv)
    env = write_secrets(args.out, [n for n in args.nodes.split(",") if n], [t for t in args.teams.split(",") if t])
    print(f"{len(env)} passwords under {args.out}")


if __name__ == "__main__":
    main()
