"""The slice cache: watch events, our own writes and their echoes, deletes and late events."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.publish.cache import SliceCache, is_stub, rv_newer


def obj(name: str, uid: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "resourceVersion": str(rv)}}


@pytest.mark.parametrize(
    ("candidate", "current", "newer"),
    [("10", "9", True), ("9", "10", False), ("10", "10", False), ("abc", "10", True), ("100", "99", True)],
)
def test_rv_newer(candidate: str, current: str, newer: bool) -> None:
    assert rv_newer(candidate, current) is newer


def test_echo_of_our_write_is_not_a_change() -> None:
    cache = SliceCache()
    cache.record_write(obj("a", "u1", 5))
    assert not cache.apply_event("ADDED", obj("a", "u1", 5))
    assert cache.apply_event("MODIFIED", obj("a", "u1", 6))  # someone else's edit
    assert not cache.apply_event("MODIFIED", obj("a", "u1", 6))


def test_late_event_does_not_resurrect_a_deleted_slice() -> None:
    cache = SliceCache()
    cache.replace([obj("a", "u1", 5)])
    cache.record_delete("a", "u1")
    assert cache.snapshot() == []
    assert not cache.apply_event("MODIFIED", obj("a", "u1", 6))
    assert not cache.apply_event("DELETED", obj("a", "u1", 7))
    assert cache.snapshot() == []


def test_recreated_name_with_new_uid_replaces() -> None:
    cache = SliceCache()
    cache.replace([obj("a", "u1", 5)])
    assert cache.apply_event("ADDED", obj("a", "u2", 3))
    assert cache.apply_event("DELETED", obj("a", "u2", 8))
    assert not cache.apply_event("DELETED", obj("a", "u1", 9))
    assert cache.snapshot() == []


def test_older_write_result_does_not_overwrite_newer_event() -> None:
    cache = SliceCache()
    cache.apply_event("MODIFIED", obj("a", "u1", 9))
    cache.record_write(obj("a", "u1", 8))
    assert cache.snapshot() == [obj("a", "u1", 9)]


def full(name: str, uid: str, rv: int) -> dict[str, Any]:
    return {**obj(name, uid, rv), "spec": {"driver": "d"}}


def stubs(cache: SliceCache) -> list[str]:
    return [s["metadata"]["name"] for s in cache.snapshot() if is_stub(s)]


def test_a_metadata_event_leaves_a_stub_until_fetched() -> None:
    cache = SliceCache()
    cache.replace([full("a", "u1", 5)])
    assert stubs(cache) == []
    assert cache.apply_event("MODIFIED", obj("a", "u1", 6))  # someone else's edit, metadata alone
    assert stubs(cache) == ["a"]
    cache.fill("a", full("a", "u1", 7))  # the GET found a still newer version
    assert stubs(cache) == []
    assert cache.snapshot() == [full("a", "u1", 7)]


def test_our_write_replaces_the_stub_of_its_own_echo() -> None:
    cache = SliceCache()
    # The watch's echo of our create arrived before the create's answer.
    assert cache.apply_event("ADDED", obj("a", "u1", 5))
    cache.record_write(full("a", "u1", 5))
    assert stubs(cache) == []
    assert cache.snapshot() == [full("a", "u1", 5)]


def test_a_stub_found_gone_is_dropped() -> None:
    cache = SliceCache()
    cache.apply_event("ADDED", obj("a", "u1", 5))
    cache.fill("a", None)
    assert cache.snapshot() == []
