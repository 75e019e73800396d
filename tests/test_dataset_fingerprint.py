"""The fingerprint `corral submit` takes of a local dataset (#41, events/fingerprint.py): it moves with every
edit, stays with an untouched tree, is bounded, and makes the cache key; what it cannot read is left alone."""

from __future__ import annotations

import os
from pathlib import Path

from events.fingerprint import fingerprint, with_fingerprints
from schemas import JobSpec, parse_jobspec
from schemas.datasets import FINGERPRINT_RE, Dataset
from schemas.jobspec import jobspec_problems


def tree(root: Path) -> Path:
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.txt").write_text("hello")
    (root / "y.bin").write_bytes(b"\1" * 100)
    return root


def test_the_fingerprint_moves_with_each_kind_of_edit_and_only_then(tmp_path: Path) -> None:
    root = tree(tmp_path / "set")
    seen = {fingerprint(root)}
    assert FINGERPRINT_RE.fullmatch(next(iter(seen)))
    assert fingerprint(root) in seen  # untouched: the same
    (root / "a" / "x.txt").write_text("HELLO")  # same size, new content
    seen.add(fingerprint(root))
    (root / "y.bin").write_bytes(b"\1" * 99)  # truncated
    seen.add(fingerprint(root))
    (root / "a" / "new").write_text("")  # added
    seen.add(fingerprint(root))
    (root / "a" / "new").rename(root / "a" / "renamed")
    seen.add(fingerprint(root))
    (root / "a" / "renamed").unlink()  # removed
    seen.add(fingerprint(root))
    st = (root / "y.bin").stat()
    (root / "y.bin").write_bytes(b"\2" * 99)
    os.utime(root / "y.bin", ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: ctime still moved
    seen.add(fingerprint(root))
    assert len(seen) == 7
    assert fingerprint(root / "y.bin") != fingerprint(root)  # a single file has one too


def test_submit_fingerprints_local_sources_only_and_notes_what_it_cannot(tmp_path: Path) -> None:
    root = tree(tmp_path / "set")
    spec = parse_jobspec({"name": "t", "command": ["true"], "datasets": [
        {"name": "local", "source": str(root), "mount": "/l"},
        {"name": "url", "source": f"file://{root}", "mount": "/u"},
        {"name": "pinned", "source": str(root), "mount": "/p", "digest": "sha256:" + "0" * 64},
        {"name": "web", "source": "https://example.org/x.tar", "mount": "/w"},
        {"name": "gone", "source": str(tmp_path / "missing"), "mount": "/g"}]})
    out, notes = with_fingerprints(spec)
    by = {d.name: d for d in out.dataset_list}
    assert by["local"].fingerprint == by["url"].fingerprint == fingerprint(root)
    assert by["pinned"].fingerprint == by["web"].fingerprint == by["gone"].fingerprint == ""
    assert len(notes) == 1 and "dataset gone" in notes[0] and "corral datasets evict gone" in notes[0]
    # The key names the source and the fingerprint; without one (or with a digest) it is what it was.
    assert by["local"].key != Dataset(name="local", source=str(root), mount="/l").key
    assert by["pinned"].key == spec.dataset_list[2].key and by["gone"].key == spec.dataset_list[4].key
    # What the spec carries passes validation, and fingerprinting it again changes nothing.
    assert jobspec_problems(msgspec_builtins(out)) == []
    again, _ = with_fingerprints(out)
    assert again is out
    # Past the bound: not fingerprinted, said so.
    big, notes = with_fingerprints(parse_jobspec({"name": "t", "command": ["true"], "datasets": [
        {"name": "local", "source": str(root), "mount": "/l"}]}), max_entries=2)
    assert big.dataset_list[0].fingerprint == "" and "more than 2 files" in notes[0]


def test_a_malformed_fingerprint_is_a_spec_problem() -> None:
    problems = jobspec_problems({"name": "t", "command": ["true"], "datasets": [
        {"name": "d", "source": "/x", "mount": "/d", "fingerprint": "md5:abc"}]})
    assert [p.path for p in problems] == ["datasets[0].fingerprint"]


def msgspec_builtins(spec: JobSpec) -> object:
    import msgspec

    return msgspec.to_builtins(spec)
