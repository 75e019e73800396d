"""Generated passwords always load: nats-server parses an environment value as a config value.

`token_urlsafe` passwords starting with `-`, or a digit then `-`, made the real server refuse
its config ("Expected a digit", "All ISO8601 dates must be in full Zulu form"): 37 of 200 sets.
These tests run the real binary (`nats-server -t`) on the committed single-server config with
each generated set in its environment, and log in with one set on a running server.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nats

from deploy.nats.render import DEPLOY, EXAMPLE_NODES, EXAMPLE_TEAMS
from deploy.nats.secrets import write_secrets
from events.security import connect_options
from tests.deploy.launcher import nats_server_binary, secured_server

SETS = 500
CONF = DEPLOY / "nats" / "single.conf"


def _refusal(env: dict[str, str]) -> str | None:
    """nats-server's complaint about the committed config with `env`, None if it accepts it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    out = subprocess.run([str(nats_server_binary()), "-t", "-c", str(CONF)], env={**clean, **env},
                         capture_output=True, text=True, timeout=30, cwd=CONF.parent)  # fmt: skip
    return None if out.returncode == 0 else (out.stderr + out.stdout).strip()


def test_500_generated_sets_all_load(tmp_path: Path) -> None:
    """0 of 500 freshly generated secret sets are refused by `nats-server -t`."""
    sets = [write_secrets(tmp_path / str(i), EXAMPLE_NODES, EXAMPLE_TEAMS) for i in range(SETS)]
    assert len({pw for env in sets for pw in env.values()}) == SETS * len(sets[0]), "passwords repeat"
    with ThreadPoolExecutor(max_workers=2) as pool:
        refusals = [(env, r) for env, r in zip(sets, pool.map(_refusal, sets), strict=True) if r is not None]
    assert not refusals, f"{len(refusals)} of {SETS} sets refused, e.g. {refusals[0][1]}"


def test_the_env_file_matches_the_password_files(tmp_path: Path) -> None:
    """`nats-users.env` (the servers' side) holds exactly the passwords of the `<user>.password` files."""
    out = tmp_path / "secrets"
    env = write_secrets(out, EXAMPLE_NODES, EXAMPLE_TEAMS)
    lines = dict(line.split("=", 1) for line in (out / "nats-users.env").read_text().splitlines())
    assert lines == env
    assert (out / "ops.password").read_text() == env["CORRAL_OPS_PASSWORD"] + "\n"


async def test_a_generated_password_logs_in(tmp_path: Path) -> None:
    """The server reads the value as that very string: the user logs in with the password file's text."""
    env = write_secrets(tmp_path / "secrets", list(EXAMPLE_NODES), EXAMPLE_TEAMS)
    password = (tmp_path / "secrets" / "ops.password").read_text().splitlines()[0]
    with secured_server(tmp_path, "s", list(EXAMPLE_NODES), env) as srv:
        nc = await nats.connect(srv.url, allow_reconnect=False, connect_timeout=3,
                                **connect_options(user="ops", password=password))  # fmt: skip
        try:
            await nc.jetstream(timeout=3).account_info()
        finally:
            await nc.close()
