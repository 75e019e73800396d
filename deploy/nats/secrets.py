"""Make the passwords the rendered configs expect: one per user, in the two shapes needed.

    python -m deploy.nats.secrets --out deploy/secrets [--nodes node1,node2] [--teams vision,nlp]

writes (directory 0700, files 0600, never committed: deploy/.gitignore):

- `nats-users.env`: `CORRAL_<USER>_PASSWORD=...` lines, the servers' environment
  (docker compose `env_file`, `kubectl create secret generic --from-env-file`).
- `<user>.password`: the same password alone, for that user's `--password-file`
  (compose `secrets:`, a Kubernetes Secret, or a file an agent's node is
  provisioned with).

Existing files are kept (rotating a password is a deliberate act: delete the
file, rerun, restart the server and that user's service).
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from deploy.nats.render import DEPLOY, EXAMPLE_NODES, EXAMPLE_TEAMS, password_env, users


def write_secrets(out: Path, nodes: Sequence[str], teams: Sequence[str] = ()) -> dict[str, str]:
    """Write (or keep) every user's password; returns env var -> password."""
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    names = [u for u, _, _ in users(nodes, teams)] + ["sys"]
    env: dict[str, str] = {}
    for user in names:
        path = out / f"{user}.password"
        if not path.exists():
            _write_private(path, secrets.token_urlsafe(24) + "\n")
        env[password_env(user)] = path.read_text().splitlines()[0]
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
