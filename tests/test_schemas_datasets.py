"""`JobSpec.datasets` and `locality` (#33): validation that says what to fix, cache keys every reader agrees on,
and specs without them encoded exactly as before."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import Dataset, InvalidJobSpec, JobSpec, encode, jobspec_problems, parse_jobspec
from schemas.datasets import cache_key, source_scheme
from schemas.events import JobSubmitted

HEX = "ab" * 32


def problems(obj: dict[str, Any]) -> dict[str, str]:
    return {p.path: p.message for p in jobspec_problems({"name": "x", **obj})}


def test_a_spec_with_datasets_parses() -> None:
    spec = parse_jobspec({"name": "x", "locality": "require", "datasets": [
        {"name": "pile", "source": "https://data.example/pile.tar.gz", "digest": f"sha256:{HEX}", "mount": "/data"},
        {"name": "tok_2", "source": "/shared/tok", "mount": "/tok"},
        {"name": "s", "source": "file:///shared/s", "mount": "/s"},
        {"name": "b", "source": "s3://bucket/key.tar", "mount": "/b"},
    ]})
    pile, tok, *_ = spec.dataset_list
    assert pile == Dataset(name="pile", source="https://data.example/pile.tar.gz", digest=f"sha256:{HEX}",
                           mount="/data")
    assert spec.locality_mode == "require"
    assert pile.key == f"sha256-{HEX}" and pile.env_name == "CORRAL_DATASET_PILE" and pile.sha256 == HEX
    assert tok.key == "src-" + hashlib.sha256(b"/shared/tok").hexdigest()[:32] and tok.sha256 == ""
    assert [source_scheme(d.source) for d in spec.dataset_list] == ["https", "file", "file", "s3"]


def test_a_spec_without_datasets_encodes_as_before() -> None:
    """Old logs and the simulator's logs keep their bytes: the new fields are not written when unused."""
    for spec in (JobSpec(name="x"), parse_jobspec({"name": "x", "datasets": [], "locality": None})):
        raw = encode(JobSubmitted(event_id="e", occurred_at=1.0, job_id="j", spec=spec))
        assert b"datasets" not in raw and b"locality" not in raw
        assert spec.dataset_list == () and spec.locality_mode == "prefer"
    one = Dataset(name="a", source="/a", mount="/a")
    assert b"digest" not in msgspec.json.encode(one)  # an entry without a digest is written without one


def test_the_key_is_the_digest_whatever_the_source() -> None:
    assert cache_key("http://a/x.tar", HEX) == cache_key("/b", f"sha256:{HEX.upper()}") == f"sha256-{HEX}"
    assert cache_key("http://a/x.tar") != cache_key("http://a/y.tar")


@pytest.mark.parametrize(("datasets", "path", "says"), [
    ("pile", "datasets", "must be a list"),
    ([{"name": "1x", "source": "/a", "mount": "/a"}], "datasets[0].name", "CORRAL_DATASET_"),
    ([{"name": "a-b", "source": "/a", "mount": "/a"}], "datasets[0].name", "letters, digits or _"),
    ([{"name": "a", "source": "/a", "mount": "/a"}, {"name": "A", "source": "/b", "mount": "/b"}],
     "datasets[1].name", "repeats datasets[0].name"),
    ([{"name": "a", "source": "data/x", "mount": "/a"}], "datasets[0].source", "absolute path"),
    ([{"name": "a", "source": "ftp://h/x", "mount": "/a"}], "datasets[0].source", "http(s)://"),
    ([{"name": "a", "source": "file://rel/x", "mount": "/a"}], "datasets[0].source", "file:///data/set"),
    ([{"name": "a", "source": "s3://bucket", "mount": "/a"}], "datasets[0].source", "s3://bucket/key"),
    ([{"name": "a", "source": 3, "mount": "/a"}], "datasets[0].source", "path or URL"),
    ([{"name": "a", "source": "/a", "mount": "rel"}], "datasets[0].mount", "absolute path"),
    ([{"name": "a", "source": "/a", "mount": "/"}], "datasets[0].mount", "other than /"),
    ([{"name": "a", "source": "/a", "mount": "/m"}, {"name": "b", "source": "/b", "mount": "/m/"}],
     "datasets[1].mount", "repeats datasets[0].mount"),
    ([{"name": "a", "source": "/a", "mount": "/a", "digest": "md5:00"}], "datasets[0].digest", "sha256:<64 hex"),
    ([{"name": "a", "source": "/a", "mount": "/a", "size": 3}], "datasets[0].size", "unknown field"),
    ([{"source": "/a", "mount": "/a"}], "datasets[0].name", "got None"),
    (["x"], "datasets[0]", "must be a mapping"),
])
def test_each_problem_names_its_field_and_what_to_do(datasets: Any, path: str, says: str) -> None:
    found = problems({"datasets": datasets})
    assert path in found and says in found[path], found


def test_locality_is_checked() -> None:
    assert "must be 'prefer' or 'require'" in problems({"locality": "always"})["locality"]
    assert "needs datasets" in problems({"locality": "require"})["locality"]
    assert problems({"locality": "prefer"}) == {}


def test_every_problem_at_once() -> None:
    with pytest.raises(InvalidJobSpec) as e:
        parse_jobspec({"name": "x", "locality": 1, "datasets": [{"name": "", "source": "", "mount": ""}]})
    assert {p.path for p in e.value.problems} == {"locality", "datasets[0].name", "datasets[0].source",
                                                  "datasets[0].mount"}


DATASETS = st.lists(st.builds(
    Dataset,
    name=st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,10}", fullmatch=True),
    source=st.sampled_from(["/shared/a", "file:///b", "http://h/x.tar", "https://h/y.zip", "s3://b/k"]),
    mount=st.from_regex(r"/[a-z0-9_]{1,12}", fullmatch=True),
    digest=st.sampled_from(["", f"sha256:{HEX}", HEX]),
), max_size=4, unique_by=(lambda d: d.name.upper(), lambda d: d.mount)).map(tuple)


@settings(max_examples=100)
@given(DATASETS, st.sampled_from(["prefer", "require"]))
def test_valid_datasets_parse_back_to_themselves(datasets: tuple[Dataset, ...], locality: str) -> None:
    spec = JobSpec(name="x", datasets=datasets, locality=locality) if datasets else JobSpec(name="x")  # type: ignore[arg-type]
    obj = msgspec.to_builtins(spec)
    assert jobspec_problems(obj) == []
    assert parse_jobspec(obj) == spec
