"""Fuzz: every input a stranger controls is read totally (issue #19, acceptance 4).

Random and mutated inputs (bit flips, truncation, inserted and deleted bytes,
invalid UTF-8 inside strings, deep nesting, huge numbers, fields of the wrong
type, spliced documents), seeded from real data: every golden log line (one
per event type), the example job specs (YAML and JSON), cluster specs as the
generator writes them, a trace CSV. Each reader may answer only with its
documented result:

- `schemas.decode`: an event or `Unknown` (with a reason from the closed set);
  and `corral tail` prints that as one line, or one valid JSON object;
- the job-spec loader (`read_jobspec`) and parser (`parse_jobspec`): a JobSpec
  or `SpecError` (SpecInputError / InvalidJobSpec);
- the cluster-spec loader (`read_cluster`): a ClusterSpec or ClusterSpecError;
- the trace reader (`read_jobs`): jobs or TraceError.

Counts: CORRAL_FUZZ_CASES (default 100,000) for decode; the YAML loaders and
the trace reader run CORRAL_FUZZ_CASES_SLOW (default 1,000: pure-Python YAML
takes ~10 ms a mutant, so 100,000 is ~20 minutes of one core each);
`CORRAL_FUZZ_CASES_SLOW=100000` is the full acceptance run.
"""

from __future__ import annotations

import io
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import yaml

from events.bus import Envelope
from orchestrator.cli.render import line
from orchestrator.cli.tail import json_line
from orchestrator.sim.cluster import ClusterSpecError, dump_cluster, read_cluster
from orchestrator.sim.gen import standard_cluster
from orchestrator.sim.trace import TraceError, read_jobs
from schemas import EVENT_TYPES, JobSubmitted, Unknown, decode, parse_jobspec
from schemas.events import UNREADABLE_REASONS
from schemas.jobspec import read_jobspec
from schemas.specinput import SpecError

ROOT = Path(__file__).resolve().parent.parent
CASES = int(os.environ.get("CORRAL_FUZZ_CASES", "100000"))
SLOW_CASES = int(os.environ.get("CORRAL_FUZZ_CASES_SLOW", "1000"))

GOLDEN = [ln for ln in (ROOT / "tests/golden/v1_events.jsonl").read_bytes().splitlines() if ln.strip()]
JOB_SPECS = [p.read_bytes() for p in sorted((ROOT / "examples/jobs").glob("*.yaml"))]
JOB_SPECS += [json.dumps(yaml.safe_load(s)).encode() for s in list(JOB_SPECS)]
JOB_SPECS += [msgspec.json.encode(ev.spec) for ev in map(decode, GOLDEN) if isinstance(ev, JobSubmitted)]
CLUSTER_SPECS = [dump_cluster(standard_cluster(nodes=16, queues=3)).encode(),
                 dump_cluster(standard_cluster(nodes=12, queues=2, half_life_s=3600.0)).encode(),
                 b"nodes:\n  - {count: 4, gpu_model: H100}\n  - {count: 2, gpus_per_node: 4, gpu_model: A100}\n"
                 b"topology:\n  - {level: leaf, size: 2}\nqueues:\n  - &q {name: a, weight: 2}\n"
                 b"  - {name: b, parent: a, limit_gpus: 8}\n"]
TRACE = (b"job_id,submit_time,duration,num_gpus,queue,priority,preemptible,gpu_model,topology,time_limit\n"
         b"j1,0,60,8,q0,0,true,H100,leaf:require,120\nj2,5,30.5,16,q1,10,false,,node,\n")

#: Bytes that break UTF-8 or JSON/YAML where they land: invalid starts, overlongs, an encoded surrogate,
#: a truncated sequence, NUL, quotes, brackets, a YAML anchor and alias, a tag, a BOM.
NASTY = [b"\xff", b"\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x00", b'"', b"\\", b"\\u", b"\\ud800",
         b"[", b"{", b"]", b"}", b",", b":", b"&a ", b"*a", b"!!python/object:os.system ", b"\xef\xbb\xbf",
         b"\n", b"\t", b"- ", b"? ", b"<<: ", b"%YAML 1.1\n", b"---\n", b"\r", b"\x1b[2J", b"\xe2\x80\xa8"]
HUGE = [b"9" * 5000, b"1e999", b"-1e999", b"0x" + b"f" * 3000, b"18446744073709551616", b"-9223372036854775809",
        b"NaN", b".nan", b"Infinity", b"1" * 400 + b".5", b"4.9e-325"]
WRONG = [None, True, -1, 0, 2**64, 1e308, "", "x" * 300, [], [1, [2]], {}, {"type": "JobSubmitted"}, "\ud800"]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to three random mutations of `data`."""
    for _ in range(rng.randint(1, 3)):
        n = len(data)
        i = rng.randint(0, n)
        kind = rng.randrange(12)
        if kind == 0 and n:  # bit flips
            b = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                j = rng.randrange(n)
                b[j] ^= 1 << rng.randrange(8)
            data = bytes(b)
        elif kind == 1:  # truncation
            data = data[:i]
        elif kind == 2:  # a nasty byte sequence inserted anywhere
            data = data[:i] + rng.choice(NASTY) + data[i:]
        elif kind == 3:  # invalid UTF-8 just inside a string
            q = data.find(b'"', i)
            data = data[:q + 1] + rng.choice([b"\xff", b"\xc3", b"\xed\xb0\x80", b"\xf8\x88\x80\x80\x80"]) \
                + data[q + 1:] if q >= 0 else data + b"\xff"
        elif kind == 4:  # random bytes inserted
            data = data[:i] + rng.randbytes(rng.randint(1, 16)) + data[i:]
        elif kind == 5 and n:  # a span deleted
            j = rng.randint(i, min(n, i + 32))
            data = data[:i] + data[j:]
        elif kind == 6 and n:  # a span repeated
            j = rng.randint(i, min(n, i + 64))
            data = data[:i] + data[i:j] * rng.randint(2, 50) + data[j:]
        elif kind == 7:  # deep nesting around or inside
            d = rng.choice([10, 100, 1000, 20000])
            opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}"), (b"- ", b""), (b"a:\n ", b"")])
            data = data[:i] + opener * d + data[i:] + closer * rng.choice([0, d])
        elif kind == 8:  # a number replaced by a huge or odd one
            digits = [k for k in range(n) if 48 <= data[k] <= 57]
            k = rng.choice(digits) if digits else i
            data = data[:k] + rng.choice(HUGE) + data[k + 1:]
        elif kind == 9:  # a field of the wrong type (structural, when it is still JSON)
            data = _retyped(rng, data)
        elif kind == 10:  # splice with another document
            other = rng.choice(GOLDEN + JOB_SPECS)
            data = data[:i] + other[rng.randint(0, len(other)):]
        else:  # pure random bytes
            data = rng.randbytes(rng.randint(0, 200))
    return data


def _retyped(rng: random.Random, data: bytes) -> bytes:
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return data + b"\xff"
    target = obj
    while isinstance(target, dict) and target and rng.random() < 0.7:
        key = rng.choice(sorted(target, key=str))
        if isinstance(target[key], (dict, list)) and target[key] and rng.random() < 0.5:
            nxt = target[key]
            target = nxt if isinstance(nxt, dict) else nxt[0] if isinstance(nxt[0], dict) else target
            if target is not nxt and not isinstance(nxt, dict):
                break
            continue
        target[key] = rng.choice(WRONG)
        break
    else:
        if isinstance(target, dict):
            target[rng.choice(["type", "spec", "ranks", "x"])] = rng.choice(WRONG)
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def run(n: int, seeds: list[bytes], read: Callable[[bytes], Any], allowed: tuple[type[BaseException], ...],
        rng: random.Random) -> tuple[int, list[str]]:
    """Feed `n` mutated seeds to `read`; (inputs the reader refused as documented, what else it raised)."""
    refused, bad = 0, []
    for _ in range(n):
        data = mutate(rng, rng.choice(seeds))
        try:
            read(data)
        except allowed:
            refused += 1
        except Exception as e:  # what the test is here to find
            bad.append(f"{type(e).__name__}: {str(e)[:120]} <- {data[:120]!r}")
    return refused, bad


def test_fuzz_decode_is_total() -> None:
    """Fault: CASES mutated golden lines (every event type) and random bytes.
    Check: decode returns an event or an Unknown with a known reason, never raises; tail's line for it
    is one line and its --json line one valid JSON object."""
    rng = random.Random(19_02)
    unreadable = 0
    types = (*EVENT_TYPES, Unknown)

    def read(data: bytes) -> None:
        nonlocal unreadable
        event = decode(data)
        assert isinstance(event, types), type(event)
        env = Envelope(7, "corral.job.j-1.JobSubmitted", 1.8e9, event)
        text = line(env)
        if isinstance(event, Unknown):
            unreadable += 1
            assert event.reason in UNREADABLE_REASONS, event.reason
            assert "\n" not in text and "unreadable at position 7: " in text, text
            record = msgspec.json.decode(json_line(env))
            assert record["type"] == "Unknown" and record["unreadable"].startswith("unreadable at position 7")

    t0 = time.perf_counter()
    _, bad = run(CASES, GOLDEN, read, (), rng)
    assert not bad, f"{len(bad)} of {CASES} inputs raised in decode/tail:\n" + "\n".join(bad[:10])
    assert unreadable > CASES // 2  # the mutations mostly hit: the test exercises the error paths
    print(f"decode: {CASES} inputs, {unreadable} unreadable, 0 exceptions, {time.perf_counter() - t0:.1f} s")


def test_fuzz_jobspec_loader_and_parser() -> None:
    """Fault: SLOW_CASES mutated job spec files (YAML and JSON), read as YAML and as JSON; and the decoded
    mutants (whatever they hold) handed to parse_jobspec. Check: a JobSpec or SpecError, nothing else."""
    rng = random.Random(19_09)
    parsed: list[Any] = []

    def read(data: bytes) -> None:
        try:
            read_jobspec(data, json=rng.random() < 0.3)
        finally:
            try:  # libyaml, unbounded: parse_jobspec must cope with whatever a caller hands it
                parsed.append(yaml.load(data, Loader=yaml.CSafeLoader))
            except Exception:
                parsed.append(data.decode("latin-1"))

    t0 = time.perf_counter()
    refused, bad = run(SLOW_CASES, JOB_SPECS, read, (SpecError,), rng)
    bad += [f"parse_jobspec {type(e).__name__}: {e}" for e in _errors(parsed, parse_jobspec, (SpecError,))]
    assert not bad, f"{len(bad)} of {SLOW_CASES} inputs raised:\n" + "\n".join(bad[:10])
    assert 0 < refused < SLOW_CASES
    print(f"job specs: {SLOW_CASES} files ({refused} refused) + {len(parsed)} parsed objects, 0 exceptions, "
          f"{time.perf_counter() - t0:.1f} s")


def _errors(objs: list[Any], parse: Callable[[Any], Any], allowed: tuple[type[BaseException], ...]) -> list[BaseException]:
    out: list[BaseException] = []
    for obj in objs:
        try:
            parse(obj)
        except allowed:
            pass
        except Exception as e:
            out.append(e)
    return out


def test_fuzz_cluster_spec_loader() -> None:
    """Fault: SLOW_CASES mutated cluster specs (as the generator writes them, and one with anchors).
    Check: a ClusterSpec or ClusterSpecError, nothing else."""
    rng = random.Random(19_04)
    t0 = time.perf_counter()
    refused, bad = run(SLOW_CASES, CLUSTER_SPECS, read_cluster, (ClusterSpecError,), rng)
    assert not bad, f"{len(bad)} of {SLOW_CASES} inputs raised:\n" + "\n".join(bad[:10])
    assert 0 < refused < SLOW_CASES
    print(f"cluster specs: {SLOW_CASES} files ({refused} refused), 0 exceptions, {time.perf_counter() - t0:.1f} s")


def test_fuzz_trace_reader() -> None:
    """Fault: mutated trace CSVs. Check: jobs or TraceError, nothing else."""
    rng = random.Random(19_05)

    def read(data: bytes) -> None:
        read_jobs(io.StringIO(data.decode("utf-8", "replace"), newline=""), "t.csv")

    wide = TRACE + b'j3,1,1,1,"' + b"q" * 200_000 + b'"\n'  # a field past csv's limit: csv.Error, unless caught
    _, bad = run(SLOW_CASES, [TRACE, wide], read, (TraceError,), rng)
    assert not bad, f"{len(bad)} of {SLOW_CASES} inputs raised:\n" + "\n".join(bad[:10])


def test_bounds_are_checked_before_parsing() -> None:
    """A 50 MB spec, a billion-laughs alias bomb, 500,000 levels of nesting and a non-UTF-8 byte: each refused
    with its reason (the size before any parsing), not parsed in full and then refused by NATS."""
    big = b"name: x\nenv:\n" + b"  K: " + b"v" * (50 << 20) + b"\n"
    laughs = [b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    laughs += [b"%c: &%c [%s]" % (98 + i, 98 + i, b",".join([b"*%c" % (97 + i)] * 9)) for i in range(9)]
    bomb = b"\n".join([*laughs, b"name: *j"]) + b"\n"
    for data, says in ((big, "too large"), (bomb, "aliases are expanded"), (b"[" * 500_000, "nested deeper"),
                       (b'name: "\xff"', "byte 0xff at offset 7")):
        try:
            read_jobspec(data)
        except SpecError as e:
            assert says in str(e), str(e)
        else:
            raise AssertionError(f"accepted {data[:40]!r}")
