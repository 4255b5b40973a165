"""Sample decoding and batch building on the trainer's hot path (``model.trainer.samples``)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from model.trainer.dedupe import TrainedIds, id_hash, id_hashes
from model.trainer.samples import (
    KeyCache,
    Sample,
    SampleError,
    decode_sample,
    digest_of_hashes,
    sample_digest,
    to_batch,
)
from streamrec.ids import item_key, user_key


def _sample(i: int, history: tuple[str, ...]) -> Sample:
    return Sample(f"s{i}", f"u{i % 3}", f"i{i}", "click", 1.0 + i, 1_000 + i, history)


def _reference_history(samples: list[Sample], history_len: int) -> np.ndarray:
    out = np.zeros((len(samples), max(history_len, 1)), np.int64)
    for r, s in enumerate(samples):
        for c, item in enumerate(s.history[:history_len]):
            out[r, c] = item_key(item)
    return out


@pytest.mark.parametrize("history_len", [0, 1, 3, 8])
def test_to_batch_truncates_pads_and_keys_every_column(history_len: int) -> None:
    samples = [_sample(i, tuple(f"h{i}-{j}" for j in range(i))) for i in range(7)]
    batch = to_batch(samples, history_len, KeyCache())
    np.testing.assert_array_equal(batch.history, _reference_history(samples, history_len))
    assert batch.user_keys.tolist() == [user_key(s.user_id) for s in samples]
    assert batch.item_keys.tolist() == [item_key(s.item_id) for s in samples]
    assert batch.weights.dtype == np.float32
    assert batch.weights.tolist() == [s.weight for s in samples]


def test_to_batch_of_nothing_is_empty() -> None:
    batch = to_batch([], 4)
    assert len(batch) == 0
    assert batch.history.shape == (0, 4)


def test_key_cache_is_bounded_and_never_changes_a_key() -> None:
    keys = KeyCache(max_size=4)
    ids = [f"x{i}" for i in range(10)] * 2
    for start in range(0, len(ids), 3):
        part = ids[start:start + 3]
        assert keys.items(part).tolist() == [item_key(x) for x in part]
        assert len(keys._items) <= 4 + len(part)
    assert keys.item("x3") == item_key("x3")
    assert keys.users(["a", "b"]).tolist() == [user_key("a"), user_key("b")]
    assert keys.user("a") == user_key("a")


def test_digest_of_hashes_equals_the_sum_of_blake2b_values() -> None:
    ids = [f"e{i}" for i in range(1000)] + ["", "\u00fc"]
    reference = sum(
        int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little") for s in ids
    ) % (1 << 64)
    assert sample_digest(ids) == reference
    assert digest_of_hashes(id_hashes(ids)) == reference
    assert id_hashes(ids).tolist() == [id_hash(s) for s in ids]
    assert sample_digest([]) == 0


def test_admitting_hashes_equals_admitting_ids() -> None:
    by_id, by_hash = TrainedIds(), TrainedIds()
    for part in (["a", "b", "a"], ["c", "d", "e", "f"], ["a", "f", "g"]):
        assert by_id.admit(part).tolist() == by_hash.admit_hashes(id_hashes(part)).tolist()
    assert by_id.to_array().tolist() == by_hash.to_array().tolist()


@pytest.mark.parametrize("history", [["a", ""], ["a", True], [["a"]], "ab", None, [None]])
def test_a_history_that_is_not_a_list_of_ids_is_rejected(history: object) -> None:
    raw = json.dumps({"sample_id": "s", "user_id": "u", "item_id": "i", "event_type": "click",
                      "weight": 1.0, "ts": 1, "history": history})
    with pytest.raises(SampleError, match="history"):
        decode_sample(raw)


def test_an_absent_or_empty_history_decodes() -> None:
    base = {"sample_id": "s", "user_id": "u", "item_id": "i", "event_type": "click",
            "weight": 1.0, "ts": 1}
    assert decode_sample(json.dumps(base)).history == ()
    assert decode_sample(json.dumps({**base, "history": []})).history == ()
    assert decode_sample(json.dumps({**base, "history": ["a", "b"]})).history == ("a", "b")


def test_a_batch_keeps_its_rows_event_times_through_rows() -> None:
    from model.trainer.samples import batch_from_columns

    times = np.array([5, 6, 7], np.int64)
    batch = batch_from_columns(["u1", "u2", "u3"], ["a", "b", "c"], [["b"], [], ["a", "b"]],
                               np.ones(3, np.float32), 4, times=times)
    assert batch.times is not None and batch.times.tolist() == [5, 6, 7]
    head = batch.rows(slice(0, 2))
    assert head.times is not None and head.times.tolist() == [5, 6]
    assert batch_from_columns(["u"], ["a"], [[]], np.ones(1, np.float32), 4).rows([0]).times is None
