"""serving_gc: after it, what a serving process allocates per request starts no full collection of its heap."""
import gc

from rlsync.rollout import serving_gc


def _full_passes_while_serving() -> int:
    """Full (gen 2) collections started while 'requests' allocate small containers and keep them (the records of
    new versions, like the hub client's): more of them than a quarter of the process's heap, which is what starts
    a full pass under Python's default thresholds whatever else this process holds."""
    full = []

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(seen)
    try:
        kept = []
        for i in range(len(gc.get_objects()) // 3 + 50_000):
            kept.append({"t": [i, [i]]})
    finally:
        gc.callbacks.remove(seen)
    return len(full)


def test_serving_gc_keeps_full_collections_out_of_requests():
    before = gc.get_threshold()
    heap = [[i] for i in range(300_000)]  # the start-up heap: a model's graph, the hub client's records
    try:
        gc.collect()
        gc.set_threshold(700, 10, 10)  # Python's defaults: full passes do start here (the trap)
        assert _full_passes_while_serving() > 0
        serving_gc()
        assert gc.get_freeze_count() >= len(heap)
        assert _full_passes_while_serving() == 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    del heap
