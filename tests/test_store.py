import numpy as np
import pytest

from toolscout.results import Filter, top_k_rows
from toolscout.store.local import FaissStore, NumpyStore, load_store, make_store


def unit(rng, n, d):
    v = rng.normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def brute_force(matrix, ids, queries, k, allowed=None):
    scores = queries @ matrix.T
    out = []
    for row in scores:
        order = sorted(range(len(ids)), key=lambda i: (-row[i], i))
        out.append([ids[i] for i in order if allowed is None or ids[i] in allowed][:k])
    return out


def test_top_k_rows_orders_and_breaks_ties_by_index():
    scores = np.array([[0.1, 0.9, 0.5, 0.9, 0.0]])
    assert top_k_rows(scores, 3).tolist() == [[1, 3, 2]]
    assert top_k_rows(scores, 10).tolist() == [[1, 3, 2, 0, 4]]
    # ties that straddle the k-th place: the lowest indices win (argpartition alone keeps [984, 985, ...])
    many = np.zeros((2, 1000))
    many[0, 700] = 1.0
    many[1, 500:] = 2.0
    assert top_k_rows(many, 5).tolist() == [[700, 0, 1, 2, 3], [500, 501, 502, 503, 504]]


def test_numpy_store_matches_brute_force_with_upsert_delete_and_filters():
    rng = np.random.default_rng(0)
    vecs = unit(rng, 300, 16)
    ids = [f"t{i}" for i in range(300)]
    namespaces = ["a" if i % 3 == 0 else "b" for i in range(300)]
    store = NumpyStore(16)
    store.upsert(ids, vecs, namespaces)
    queries = unit(rng, 5, 16)
    assert store.search(queries, 10).as_lists() == brute_force(vecs, ids, queries, 10)

    # replace 10 vectors, delete 20 tools
    vecs[:10] = unit(rng, 10, 16)
    store.upsert(ids[:10], vecs[:10], namespaces[:10])
    store.delete(ids[100:120] + ["not-there"])
    keep = [i for i in range(300) if not 100 <= i < 120]
    expected = brute_force(vecs[keep], [ids[i] for i in keep], queries, 10)
    assert store.search(queries, 10).as_lists() == expected
    assert len(store) == 280

    # filters: namespace, id allow-list, exclusions
    allowed_a = {ids[i] for i in keep if namespaces[i] == "a"}
    got = store.search(queries, 10, Filter.make(namespaces=["a"])).as_lists()
    assert got == brute_force(vecs, ids, queries, 10, allowed_a)
    few = {"t1", "t2", "t250"}
    assert [set(r) for r in store.search(queries, 10, Filter.make(ids=few)).as_lists()] == [few] * 5
    got = store.search(queries, 5, Filter.make(exclude_ids=["t1"])).as_lists()
    assert all("t1" not in row for row in got)


def test_numpy_store_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    store = NumpyStore(8)
    store.upsert(["x", "y", "z"], unit(rng, 3, 8), ["n1", None, "n2"])
    config = store.save(tmp_path)
    again = load_store(tmp_path, config)
    q = unit(rng, 2, 8)
    a, b = store.search(q, 3), again.search(q, 3)
    assert a.as_lists() == b.as_lists()
    assert np.array_equal(np.concatenate(a.scores), np.concatenate(b.scores))
    assert again.search(q, 3, Filter.make(namespaces=[""])).as_lists() == [["y"], ["y"]]


def test_faiss_hnsw_recall_and_updates(tmp_path):
    pytest.importorskip("faiss")
    rng = np.random.default_rng(2)
    vecs = unit(rng, 2000, 32)
    ids = [f"t{i}" for i in range(2000)]
    exact, hnsw = NumpyStore(32), make_store("faiss:HNSW32", 32)
    assert isinstance(hnsw, FaissStore)
    for store in (exact, hnsw):
        store.upsert(ids, vecs, ["ns"] * 2000)
    queries = unit(rng, 50, 32)
    truth, approx = exact.search(queries, 10).as_lists(), hnsw.search(queries, 10).as_lists()
    recall = np.mean([len(set(a) & set(t)) / 10 for a, t in zip(approx, truth)])
    assert recall >= 0.95
    # deletes and replacements must never surface removed ids
    hnsw.delete(ids[:1000])
    exact.delete(ids[:1000])
    assert not set(sum(hnsw.search(queries, 10).as_lists(), [])) & set(ids[:1000])
    # a selective filter runs exactly and matches numpy
    flt = {"t1500", "t1501", "t1999"}
    assert hnsw.search(queries, 3, Filter.make(ids=flt)).as_lists() == exact.search(queries, 3, Filter.make(ids=flt)).as_lists()
    config = hnsw.save(tmp_path)
    again = load_store(tmp_path, config)
    assert again.search(queries, 10).as_lists() == hnsw.search(queries, 10).as_lists()


@pytest.mark.parametrize("kind", ["numpy", "faiss:HNSW32"])
def test_update_vectors_replaces_vectors_keeps_namespaces_and_refuses_unknown_ids(kind, tmp_path):
    if kind.startswith("faiss"):
        pytest.importorskip("faiss")
    rng = np.random.default_rng(5)
    vecs, ids = unit(rng, 200, 16), [f"t{i}" for i in range(200)]
    namespaces = ["a" if i % 2 else "b" for i in range(200)]
    store = make_store(kind, 16)
    store.upsert(ids, vecs, namespaces)
    queries = unit(rng, 4, 16)
    store.search(queries, 5)  # a FAISS graph now exists: the update must not be answered from it

    vecs[[3, 8]] = queries[:2]  # t3 and t8 move onto the first two queries
    store.update_vectors(["t3", "t8"], vecs[[3, 8]])
    np.testing.assert_array_equal(store.get(["t3", "t8"]), queries[:2])
    got = store.search(queries[:2], 1)
    assert got.as_lists() == [["t3"], ["t8"]]
    np.testing.assert_allclose(np.concatenate(got.scores), [1.0, 1.0], atol=1e-5)
    a_only = Filter.make(namespaces=["a"])  # t3 is still in "a", t8 still in "b"
    assert store.search(queries[:2], 1, a_only).as_lists()[0] == ["t3"]
    assert "t8" not in store.search(queries[1:2], 200, a_only).as_lists()[0]
    assert len(store) == 200

    with pytest.raises(KeyError):
        store.update_vectors(["t5", "nope"], unit(rng, 2, 16))
    np.testing.assert_array_equal(store.get(["t5"]), vecs[[5]])  # nothing changed, not even t5
    with pytest.raises(ValueError, match="duplicate"):
        store.update_vectors(["t5", "t5"], unit(rng, 2, 16))

    again = load_store(tmp_path, store.save(tmp_path))
    assert again.search(queries, 10).as_lists() == brute_force(vecs, ids, queries, 10)


def test_store_rejects_bad_shapes():
    store = NumpyStore(4)
    with pytest.raises(ValueError, match=r"\(n, 4\)"):
        store.upsert(["a"], np.zeros((1, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="duplicate"):
        store.upsert(["a", "a"], np.zeros((2, 4), dtype=np.float32))


def test_numpy_store_answers_a_few_queries_and_many_alike():
    # a few queries (a server's batch) and many use different matrix orientations: the same results
    rng = np.random.default_rng(3)
    vecs = unit(rng, 500, 32)
    store = NumpyStore(32)
    store.upsert([f"t{i}" for i in range(500)], vecs)
    queries = unit(rng, 40, 32)
    many = store.search(queries, 7)
    few = [store.search(queries[s:s + 4], 7) for s in range(0, 40, 4)]
    assert many.as_lists() == [row for r in few for row in r.as_lists()]
    np.testing.assert_allclose(np.stack(many.scores), np.stack([s for r in few for s in r.scores]), atol=1e-6)


def _prefilter_pair(vecs, ids, namespaces=None):
    """The same rows in a store that always prefilters and in one that never does."""
    fast, plain = NumpyStore(vecs.shape[1]), NumpyStore(vecs.shape[1])
    fast.PREFILTER_MIN_ROWS, plain.PREFILTER_MIN_ROWS = 0, 10**9
    for store in (fast, plain):
        store.upsert(ids, vecs, namespaces)
    return fast, plain


def test_int8_prefilter_returns_the_exact_top_k_even_among_near_duplicates():
    # 40 clusters of 50 vectors each 1e-4 apart: int8 cannot tell a cluster's members apart (its error is
    # ~1e-2), so only a correct bound keeps the whole cluster for exact rescoring
    rng = np.random.default_rng(7)
    centres = unit(rng, 40, 64)
    vecs = np.repeat(centres, 50, axis=0) + 1e-4 * rng.normal(size=(2000, 64)).astype(np.float32)
    vecs[::97] = vecs[1]  # exact copies too: ties must keep catalog order
    ids = [f"t{i}" for i in range(2000)]
    namespaces = ["even" if i % 2 == 0 else "odd" for i in range(2000)]
    fast, plain = _prefilter_pair(vecs, ids, namespaces)
    queries = np.vstack([centres[:6] + 0.05 * unit(rng, 6, 64), unit(rng, 6, 64), vecs[1:2]])
    for k in (1, 10, 120, 5000):
        for flt in (None, Filter.make(namespaces=["odd"]), Filter.make(ids=["t3", "t4", "nope"]),
                    Filter.make(namespaces=["none-such"])):
            for q in queries:
                got, want = fast.search(q[None], k, flt), plain.search(q[None], k, flt)
                assert got.as_lists() == want.as_lists(), (k, flt)
                np.testing.assert_allclose(got.scores[0], want.scores[0], rtol=0, atol=1e-6)
            batch = fast.search(queries, k, flt)  # one int8 product for the whole batch: the same answers
            assert batch.as_lists() == [plain.search(q[None], k, flt).as_lists()[0] for q in queries], (k, flt)
    assert fast.prefilter() is not None and plain.prefilter() is None
    # it does narrow the scan: a query near one cluster keeps about that cluster, not the catalog
    approx, delta = fast.prefilter().bounds(queries[:1])
    assert 50 <= len(fast.prefilter().candidates(approx[0], delta[0], 10, None)) < 200


def test_the_integer_product_is_numpys_exact_integer_product():
    """onnxruntime's kernel over the offset rows gives every dot product of int8 rows and queries within
    QUERY_LEVELS exactly, extremes included (all-extreme rows and queries are where a saturating kernel
    would be wrong)."""
    from toolscout.store.prefilter import QUERY_LEVELS, integer_product

    rng = np.random.default_rng(9)
    rows = rng.integers(-128, 128, size=(3001, 384), dtype=np.int8)
    rows[0], rows[1] = 127, -128
    product = integer_product()
    stored = product.stored(rows)
    for m in (1, 5, 64):
        queries = rng.integers(-QUERY_LEVELS, QUERY_LEVELS + 1, size=(m, 384), dtype=np.int8)
        queries[0], queries[-1][::2] = QUERY_LEVELS, -QUERY_LEVELS
        got = product(stored, queries)
        assert got.shape == (m, 3001)
        np.testing.assert_array_equal(got, queries.astype(np.int64) @ rows.T.astype(np.int64))


def test_int8_prefilter_follows_updates_and_steps_aside_when_its_bound_fails(monkeypatch):
    from toolscout.store import prefilter as prefilter_module

    rng = np.random.default_rng(8)
    vecs = 3.0 * unit(rng, 500, 32)  # not unit length: the bound scales with the norms
    ids = [f"t{i}" for i in range(500)]
    fast, plain = _prefilter_pair(vecs, ids)
    q = unit(rng, 3, 32)
    assert fast.search(q, 5).as_lists() == plain.search(q, 5).as_lists()
    copy = fast.prefilter()
    moved = -vecs[:5]  # the old best rows become the worst: a stale copy would still rank them
    added = 2.0 * unit(rng, 4, 32)
    for store in (fast, plain):
        store.upsert(ids[:5], moved)
        store.delete(ids[5:10])
        store.upsert(["n0", "n1", "n2", "n3"], added)
        store.update_vectors(ids[20:22], vecs[30:32])
    assert fast.search(q, 5).as_lists() == plain.search(q, 5).as_lists()
    # the copy followed the writes row by row (no rebuild), to exactly what a rebuild makes
    assert fast.prefilter() is copy
    rebuilt = prefilter_module.Int8Prefilter.build(fast.matrix)
    np.testing.assert_array_equal(copy.stored, rebuilt.stored)
    np.testing.assert_array_equal(copy.scales, rebuilt.scales)
    assert (copy.max_norm, copy.max_error) == (rebuilt.max_norm, rebuilt.max_error)
    fast.upsert(["bad"], np.full((1, 32), np.nan, dtype=np.float32))  # cannot follow: dropped, then refused
    assert fast.prefilter() is None
    fast.delete(["bad"])

    monkeypatch.setattr(prefilter_module, "BOUND_SAFETY", 1e-9)  # no int8 copy can meet this
    fast._matrix_changed()
    assert fast.prefilter() is None
    assert fast.search(q, 5).as_lists() == plain.search(q, 5).as_lists()
