"""What a submit takes from the submitter (#31 point 1): the directory into `workdir`, the exported variables into
`env`, and a spec without a workdir that encodes, and decodes, as before the field existed."""

from __future__ import annotations

import argparse

import msgspec
import pytest

from orchestrator.cli.errors import USAGE, CliError
from orchestrator.cli.submitter import add_submitter_args, with_submitter
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


def test_nothing_is_exported_unless_asked() -> None:
    assert with_submitter(spec(), args(), environ=SHELL, cwd="/p").env == {}


def test_export_names_and_values_and_the_spec_env_over_the_shell() -> None:
    s = with_submitter(spec(env={"MYVAR": "spec", "OWN": "1"}), args("--export", "MYVAR,PATH", "--export", "B=2"),
                       environ=SHELL, cwd="/p")
    assert s.env == {"MYVAR": "spec", "PATH": SHELL["PATH"], "B": "2", "OWN": "1"}
    # VAR=VALUE on the command line wins over the file
    assert with_submitter(spec(env={"MYVAR": "spec"}), args("--export", "MYVAR=cli"), environ=SHELL,
                          cwd="/p").env == {"MYVAR": "cli"}


def test_export_all_leaves_out_the_shells_own_and_corrals() -> None:
    env = with_submitter(spec(), args("--export-all"), environ=SHELL, cwd="/p").env
    assert env == {"PATH": SHELL["PATH"], "MYVAR": "x", "HOME": "/home/u"}


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
