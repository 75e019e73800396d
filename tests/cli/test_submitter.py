"""What a submit takes from the submitter (#31 point 1): the directory into `workdir`, the exported variables into
`env` (as Slurm's --export, ALL by default: #41 point 1), and a spec without a workdir that encodes, and decodes, as
before the field existed."""

from __future__ import annotations

import argparse

import msgspec
import pytest

from orchestrator.cli.errors import USAGE, CliError
from orchestrator.cli.submitter import MAX_EXPORT_BYTES, add_submitter_args, with_submitter
from schemas import JobSpec, JobSubmitted, decode, encode, parse_jobspec

SHELL = {"PATH": "/home/u/.venv/bin:/usr/bin", "MYVAR": "x", "PWD": "/home/u/proj", "SHLVL": "2", "TERM": "xterm",
         "CORRAL_NATS_URL": "nats://h:4222", "RANK": "7", "HOME": "/home/u"}


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_submitter_args(p)
    return p.parse_args(list(argv))


def spec(**kw: object) -> JobSpec:
    return parse_jobspec({"name": "j", "command": ["python3", "train.py"], **kw})


def test_the_submitters_directory_is_the_workdir_unless_chdir_or_the_spec_says() -> None:
    assert with_submitter(spec(), args(), environ=SHELL, cwd="/home/u/proj").workdir == "/home/u/proj"
    assert with_submitter(spec(), args("--chdir", "../data"), environ=SHELL, cwd="/home/u/proj").workdir == \
        "/home/u/data"
    assert with_submitter(spec(), args("--chdir", "/abs"), environ=SHELL, cwd="/x").workdir == "/abs"
    assert with_submitter(spec(workdir="/from/file"), args(), environ=SHELL, cwd="/x").workdir == "/from/file"
    assert with_submitter(spec(workdir="/from/file"), args("-D", "/cli"), environ=SHELL, cwd="/x").workdir == "/cli"


def test_the_whole_environment_is_exported_by_default_as_slurm_does() -> None:
    env = with_submitter(spec(), args(), environ=SHELL, cwd="/p").env
    # less the shell's own, corral's, and who the submitter is (HOME: the job runs as the agent's account)
    assert env == {"PATH": SHELL["PATH"], "MYVAR": "x"}
    assert with_submitter(spec(), args("--export", "ALL"), environ=SHELL, cwd="/p").env == env
    assert with_submitter(spec(), args("--export-all"), environ=SHELL, cwd="/p").env == env


def test_none_exports_nothing() -> None:
    assert with_submitter(spec(), args("--export", "NONE"), environ=SHELL, cwd="/p").env == {}
    assert with_submitter(spec(env={"OWN": "1"}), args("--export=NONE"), environ=SHELL, cwd="/p").env == {"OWN": "1"}


def test_a_list_narrows_it_and_all_with_a_list_adds_to_everything() -> None:
    s = with_submitter(spec(env={"MYVAR": "spec", "OWN": "1"}), args("--export", "MYVAR,PATH", "--export", "B=2"),
                       environ=SHELL, cwd="/p")
    assert s.env == {"MYVAR": "spec", "PATH": SHELL["PATH"], "B": "2", "OWN": "1"}
    # VAR=VALUE on the command line wins over the file
    assert with_submitter(spec(env={"MYVAR": "spec"}), args("--export", "MYVAR=cli"), environ=SHELL,
                          cwd="/p").env == {"MYVAR": "cli"}
    every = with_submitter(spec(), args("--export=ALL,MYVAR=b,EXTRA=1"), environ=SHELL, cwd="/p").env
    assert every == {"PATH": SHELL["PATH"], "MYVAR": "b", "EXTRA": "1"}
    assert with_submitter(spec(), args("--export", "ALL,HOME"), environ=SHELL, cwd="/p").env["HOME"] == "/home/u"


def test_a_container_job_exports_nothing_unless_asked() -> None:
    """The host's PATH would replace the image's: `image` jobs default to NONE."""
    assert with_submitter(spec(image="pytorch:24"), args(), environ=SHELL, cwd="/p").env == {}
    assert with_submitter(spec(image="pytorch:24"), args("--export", "ALL"), environ=SHELL, cwd="/p").env["MYVAR"] \
        == "x"


SECRETS = {"HF_TOKEN": "hf_x", "GITHUB_TOKEN": "g", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ACCESS_KEY_ID": "AKIA",
           "WANDB_API_KEY": "w", "PGPASSWORD": "p", "MYSQL_PWD": "p", "DB_PASSWD": "p", "GOOGLE_APPLICATION_CREDENTIALS":
           "/c.json", "SSH_PRIVATE_KEY_FILE": "k", "DOCKER_AUTH_CONFIG": "{}", "NATS_CREDS": "/n.creds",
           "SESSION_COOKIE": "c", "GPG_PASSPHRASE": "x", "CLIENT_SECRET": "x",
           "DATABASE_URL": "postgres://me:hunter2@db:5432/x"}
HARMLESS = {"TOKENIZERS_PARALLELISM": "false", "KEYTIMEOUT": "1", "XAUTHORITY": "/x", "HF_HOME": "/hf",
            "SITE_URL": "https://example.org/a:b@c", "PROXY": "http://user@proxy:3128", "NCCL_DEBUG": "INFO"}


def test_all_leaves_out_names_that_look_like_credentials_and_says_which() -> None:
    told: list[str] = []
    env = with_submitter(spec(), args(), environ={**SHELL, **SECRETS, **HARMLESS}, cwd="/p", notice=told.append).env
    assert not set(SECRETS) & set(env), set(SECRETS) & set(env)
    assert set(HARMLESS) <= set(env)
    (line,) = told
    assert all(name in line for name in SECRETS) and "--export ALL,NAME" in line, line


def test_a_name_given_explicitly_is_exported_even_if_it_looks_like_a_credential() -> None:
    told: list[str] = []
    env = with_submitter(spec(), args("--export", "ALL,HF_TOKEN"), environ={**SHELL, **SECRETS}, cwd="/p",
                         notice=told.append).env
    assert env["HF_TOKEN"] == "hf_x" and "GITHUB_TOKEN" not in env
    assert "HF_TOKEN" not in told[0] and "GITHUB_TOKEN" in told[0]
    quiet: list[str] = []
    only = with_submitter(spec(), args("--export", "HF_TOKEN"), environ={**SHELL, **SECRETS}, cwd="/p",
                          notice=quiet.append).env
    assert only == {"HF_TOKEN": "hf_x"} and quiet == []


def test_an_environment_too_large_for_the_log_is_refused_naming_the_largest() -> None:
    huge = {**SHELL, "BIG": "x" * MAX_EXPORT_BYTES, "SMALL": "y"}
    with pytest.raises(CliError, match=r"your environment is 64\.1 KiB, more than the 64\.0 KiB.*largest: BIG \(64\.0 KiB\), PATH \(26 B\).*--export") as e:
        with_submitter(spec(), args(), environ=huge, cwd="/p")
    assert e.value.code == USAGE
    assert with_submitter(spec(), args("--export", "SMALL"), environ=huge, cwd="/p").env == {"SMALL": "y"}
    with pytest.raises(CliError, match="the exported variables are"):
        with_submitter(spec(), args("--export", "BIG"), environ=huge, cwd="/p")


def test_all_and_none_together_is_an_error() -> None:
    with pytest.raises(CliError, match="ALL and NONE together") as e:
        with_submitter(spec(), args("--export", "ALL,NONE"), environ=SHELL, cwd="/p")
    assert e.value.code == USAGE


@pytest.mark.parametrize(("flag", "words"), [("NOPE", "not set in your environment"), ("CORRAL_X=1", "corral sets"),
                                             ("WORLD_SIZE", "corral sets"), ("A-B=1", "not a variable name")])
def test_export_refusals(flag: str, words: str) -> None:
    with pytest.raises(CliError, match=words) as e:
        with_submitter(spec(), args("--export", flag), environ=SHELL, cwd="/p")
    assert e.value.code == USAGE


def test_workdir_must_be_absolute_in_a_spec() -> None:
    with pytest.raises(Exception, match="workdir: must be an absolute path"):
        parse_jobspec({"name": "j", "workdir": "rel/dir"})
    assert parse_jobspec({"name": "j", "workdir": None}).working_dir is None


def test_a_spec_without_workdir_encodes_as_before_and_old_events_decode_with_none() -> None:
    plain = spec()
    assert b"workdir" not in msgspec.json.encode(plain)  # the simulator's and old logs keep their bytes
    assert plain.working_dir is None
    old = (b'{"type":"JobSubmitted","job_id":"j-1","spec":{"name":"old","command":["x"]},"submitted_by":"a",'
           b'"event_id":"submit:j-1","occurred_at":1.0}')
    event = decode(old)
    assert isinstance(event, JobSubmitted) and event.spec.working_dir is None
    placed = with_submitter(plain, args(), environ=SHELL, cwd="/p")
    back = decode(encode(JobSubmitted(event_id="e", occurred_at=1.0, job_id="j-2", spec=placed)))
    assert isinstance(back, JobSubmitted) and back.spec.working_dir == "/p"
