"""The garbage collector kept from stalling the event loop (``node/net/collector.py``): what
the node loaded is frozen out of the collector's walks once it is up, and every
collection is timed for its status."""

import gc

from node.net.collector import Collections, freeze


def test_every_collection_is_counted_by_generation_and_the_longest_kept():
    seen = Collections()
    seen.install()
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        seen.uninstall()
    st = seen.status()
    assert st["collections"][2] >= 1 and st["collections"][0] >= 1
    assert st["longest_s"][2] > 0
    before = list(seen.count)
    gc.collect(2)  # uninstalled: not counted
    assert seen.count == before


def test_frozen_objects_leave_the_full_collections_walk():
    """A heap of tracked objects, as a node's after start-up: the collector walks them all
    until they are frozen, then only what came after (``gc.get_objects``: the objects
    its collections walk)."""
    heap = [[i] for i in range(100_000)]
    assert gc.get_freeze_count() == 0
    assert len(gc.get_objects()) > len(heap)
    try:
        assert freeze() > len(heap)
        walked = len(gc.get_objects())
        later = [[i] for i in range(1000)]
        assert walked < 100 and len(gc.get_objects()) >= len(later)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0 and len(gc.get_objects()) > len(heap)


def test_a_collection_over_the_bound_is_kept_with_when_and_how_long():
    seen = Collections(keep_over_s=0.0)
    seen.install()
    try:
        gc.collect(2)
    finally:
        seen.uninstall()
    when, gen, took, blocks = seen.long[-1]
    assert gen == 2 and took > 0 and blocks > 0 and when > 1.7e9
    assert seen.status()["long"][-1] == seen.long[-1]
    assert not Collections().long  # the default bound keeps only long ones
