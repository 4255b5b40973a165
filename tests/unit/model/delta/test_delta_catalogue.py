"""Catalogued items in versions and deltas (``ModelConfig.attr_tokens``): an item nobody chose
is a candidate with its attribute row from the snapshot on, a new one joins with the next
delta, a deleted one leaves, and serving's state holds what the trainer composed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from feature_store.catalogue import FeatureSpec
from model.delta import Composer, apply, compose, decode, encode, from_snapshot, state_checksum
from model.delta.shared import map_slot, mark_writing, read_shared, write_shared
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.scoring.attributes import attribute_parts, token_rows
from model.towers.two_tower import ModelConfig
from model.trainer.deltas import DeltaBuilder
from model.trainer.export import artifact_arrays
from model.trainer.samples import KeyCache, to_batch
from model.trainer.trainer import Trainer, TrainOptions
from streamrec.ids import item_key, user_key

HISTORY = 10
BATCH = 128
SPEC = FeatureSpec()


def _rows_of(keys: np.ndarray, rows: np.ndarray, want: np.ndarray) -> np.ndarray:
    order = np.argsort(keys)
    return rows[order][np.searchsorted(keys[order], want)]


def test_catalogued_items_join_and_leave_serving_through_the_deltas(tmp_path: Path) -> None:
    stream = SyntheticStream(SyntheticConfig(users=200, items=80, clusters=4,
                                             history_len=HISTORY))
    samples = iter(stream.take(16 * BATCH))
    # keys are admitted once two items name them: entries change with admission too
    trainer = Trainer(ModelConfig(history_len=HISTORY, attr_tokens=4, attr_admit_after=2),
                      TrainOptions(batch_size=BATCH, eval_rows=0), tag="delta_cat")
    item_ids: dict[int, str] = {}
    builder = DeltaBuilder(trainer, lambda: item_ids, checksums=True)
    keys = KeyCache()

    def train(batches: int) -> None:
        for _ in range(batches):
            chunk = [next(samples) for _ in range(BATCH)]
            batch = to_batch(chunk, HISTORY, keys)
            trainer.fit_batch(batch)
            item_ids.update(zip(batch.item_keys.tolist(), [s.item_id for s in chunk], strict=True))

    def catalogue(items: list[tuple[str, dict]]) -> None:
        trainer.set_catalogue(SPEC, items)
        item_ids.update({item_key(i): i for i, _ in items})

    def same_as_a_version(state) -> None:
        """The state equals a full version of the trainer now, rows bit for bit."""
        full = artifact_arrays(trainer, item_ids)
        mine = state.artifact_arrays()
        np.testing.assert_array_equal(np.sort(mine["item_hist_keys"]),
                                      np.sort(full["item_hist_keys"]))
        np.testing.assert_array_equal(
            _rows_of(mine["item_hist_keys"], mine["item_hist_rows"], full["item_hist_keys"]),
            full["item_hist_rows"])
        f_order, m_order = np.argsort(full["item_ids"]), np.argsort(mine["item_ids"])
        assert list(np.asarray(full["item_ids"])[f_order]) == list(mine["item_ids"][m_order])
        # the towers' part bit for bit; the prior's log q is float64 here, float32 in TF
        d = trainer.config.embedding_dim
        np.testing.assert_array_equal(mine["item_vectors"][m_order][:, :d],
                                      full["item_vectors"][f_order][:, :d])
        np.testing.assert_allclose(mine["item_vectors"][m_order], full["item_vectors"][f_order],
                                   rtol=1e-5, atol=1e-5)

    catalogue([(f"i{n}", {"genres": [f"g{n % 4}"]}) for n in range(80)]
              + [("cold-a", {"genres": ["g1"], "tags": ["x"]})])
    train(3)
    snap = builder.snapshot("v1", {"samples_trained": 3 * BATCH})
    state = from_snapshot(decode(encode(snap, compress=True)))
    assert "cold-a" in state.item_ids.tolist()
    same_as_a_version(state)
    cold_a = item_key("cold-a")
    assert cold_a not in state.hist_keys.tolist()  # no own row: unknown in histories
    # only the catalogue changes: a delta is due all the same
    catalogue([("cold-b", {"genres": ["g2"], "tags": ["new"]})])
    assert builder.pending
    trainer.remove_catalogue(["cold-a"])
    item_ids.pop(cold_a)
    delta = builder.delta({"samples_trained": 3 * BATCH})
    state = apply(state, decode(encode(delta)))
    assert "cold-b" in state.item_ids.tolist() and "cold-a" not in state.item_ids.tolist()
    assert state_checksum(state) == delta.state_checksum
    same_as_a_version(state)
    # training moves id and attribute rows; the deltas keep serving equal to a version
    for n in range(3):
        train(1 + n)
        delta = builder.delta({"samples_trained": (4 + n) * BATCH})
        assert delta.attributes is not None and delta.attributes.keys.size
        state = apply(state, decode(encode(delta)))
        assert state_checksum(state) == delta.state_checksum
    same_as_a_version(state)
    # attribute rows every third delta: in between serving's parts lag, then they are exact
    builder.attr_every = 3
    for n in range(3):
        train(1)
        # two items name the new tag: admitted (ModelConfig.attr_admit_after)
        catalogue([(f"late-{n}", {"genres": ["g3"], "tags": [f"late{n}"]}),
                   (f"late-{n}-b", {"tags": [f"late{n}"]})])
        delta = builder.delta({})
        before = state.attributes
        state = apply(state, decode(encode(delta)))
        assert delta.attributes is not None and state.attributes is not None
        if n < 2:  # the parts carried over, the new entry's computed: as from scratch
            assert before is not None and "item_parts" in before.__dict__
            assert "item_parts" in state.attributes.__dict__
            a = state.attributes
            np.testing.assert_array_equal(a.item_parts,
                                          attribute_parts(a.tokens, a.weights, a.keys, a.rows))
        if n < 2:
            assert delta.attributes.keys.size  # the new key's row
            assert not np.isin(delta.attributes.keys, before.keys).any()  # new keys only
            d = trainer.config.embedding_dim
            full = artifact_arrays(trainer, item_ids)["item_vectors"][:, :d]
            assert not np.array_equal(np.sort(state.artifact_arrays()["item_vectors"][:, :d],
                                              axis=0), np.sort(full, axis=0))
    same_as_a_version(state)
    builder.attr_every = 1
    # rows moved and no key added: the entries' table positions carry over (a changed
    # entry's found afresh), and the parts from them are the parts from scratch
    state.attributes.item_parts  # noqa: B018 - computed, so the next state may carry
    catalogue([("late-0", {"genres": ["g1"], "tags": ["late0"]})])  # known keys only
    train(1)
    delta = builder.delta({})
    before = state.attributes
    state = apply(state, decode(encode(delta)))
    a = state.attributes
    assert delta.attributes is not None and delta.attributes.keys.size
    assert np.isin(delta.attributes.keys, before.keys).all()
    assert "token_rows" in a.__dict__
    np.testing.assert_array_equal(a.token_rows[0], token_rows(a.tokens, a.weights, a.keys)[0])
    np.testing.assert_array_equal(a.item_parts,
                                  attribute_parts(a.tokens, a.weights, a.keys, a.rows))
    assert state_checksum(state) == delta.state_checksum
    same_as_a_version(state)
    # what serving composes patch by patch is what it composes from scratch
    composer = Composer()
    states = [from_snapshot(decode(encode(builder.snapshot("v2", {}))))]
    # "new" (named by cold-b alone until now) is admitted: cold-b's entry travels again
    catalogue([("cold-c", {"tags": ["x", "new"]})])
    train(1)
    d2 = builder.delta({})
    assert d2.attributes is not None
    assert item_key("cold-b") in d2.attributes.item_keys.tolist()
    states.append(apply(states[0], decode(encode(d2))))
    same_as_a_version(states[1])
    composer.compose(states[0])
    patched = composer.compose(states[1], decode(encode(d2)))
    assert composer.last == "patched"
    scratch = compose(states[1])
    np.testing.assert_array_equal(patched.item_vectors[np.argsort(patched.item_ids)],
                                  scratch.item_vectors[np.argsort(scratch.item_ids)])
    np.testing.assert_array_equal(patched.item_hist_rows, scratch.item_hist_rows)
    # a user's served vector pools the attribute-composed rows of its history, as the
    # trainer's user tower does
    own = set(states[1].hist_keys.tolist())
    known = [str(i) for i in scratch.item_ids if item_key(str(i)) in own][:6]
    assert len(known) == 6
    served = scratch.user_vectors(["u-nobody"], [known])
    history = np.zeros((1, HISTORY), np.int64)
    history[0, : len(known)] = [item_key(i) for i in known]
    mine = trainer.user_vectors(np.array([user_key("u-nobody")]), history)
    np.testing.assert_allclose(served, mine, rtol=1e-4, atol=1e-5)
    # serving's workers map the composer's state: attributes and pooled rows travel too
    path = tmp_path / "slot.bin"
    path.touch()
    with path.open("r+b") as f:
        mark_writing(f)
        write_shared(f, states[1], patched, None, 5)
        mapped, served_art, _ = read_shared(map_slot(f), 5)
    assert state_checksum(mapped) == state_checksum(states[1])
    np.testing.assert_array_equal(served_art.item_hist_rows, patched.item_hist_rows)
    np.testing.assert_array_equal(served_art.item_vectors, patched.item_vectors)
