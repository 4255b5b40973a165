"""Item rows composed of id and attribute rows (ModelConfig.attr_tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from feature_store.catalogue import FeatureSpec, attribute_row, slot_keys
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.towers.tf_env import tf
from model.towers.two_tower import ModelConfig
from model.trainer.samples import KeyCache, to_batch
from model.trainer.trainer import Trainer, TrainOptions
from streamrec.ids import item_key

SPEC = FeatureSpec()


def test_attribute_row_weighs_each_slot_once() -> None:
    keys, weights = attribute_row(SPEC, {"genres": ["A", "B"], "title": "Heat"}, 5)
    genres = slot_keys(SPEC.by_name["genres"], ["A", "B"])
    title = slot_keys(SPEC.by_name["title"], ["heat"])
    assert keys.tolist() == [*genres, *title, 0, 0]
    assert weights.tolist() == pytest.approx([0.5, 0.5, 1.0, 0.0, 0.0])
    keys, weights = attribute_row(SPEC, {"genres": ["A", "B", "C"]}, 2)  # cut at the width
    assert keys.tolist() == slot_keys(SPEC.by_name["genres"], ["A", "B"])
    assert attribute_row(SPEC, {}, 3)[1].tolist() == [0.0, 0.0, 0.0]


def test_items_compose_attributes_and_cold_items_are_candidates() -> None:
    history_len, batch_size = 10, 128
    stream = SyntheticStream(SyntheticConfig(users=200, items=80, clusters=4,
                                             history_len=history_len))
    samples = stream.take(12 * batch_size)
    trainer = Trainer(
        ModelConfig(history_len=history_len, attr_tokens=4, prior_weight=0.0),
        TrainOptions(batch_size=batch_size, eval_rows=0), tag="attrs",
    )
    seen = sorted({s.item_id for s in samples})
    catalogue = [(i, {"genres": [f"g{n % 4}"], "tags": ["x", f"t{n % 3}"]})
                 for n, i in enumerate(seen)] + [("never-chosen", {"genres": ["g1"]})]
    assert trainer.set_catalogue(SPEC, catalogue) == len(seen) + 1
    keys = KeyCache()
    for i in range(0, len(samples), batch_size):
        trainer.train_step(to_batch(samples[i : i + batch_size], history_len, keys))
    model = trainer.model
    assert model.attrs is not None and model.attrs.size() == 4 + 3 + 1  # g0-3, t0-2, x
    all_keys, tower, _ = trainer.item_parts()
    cold = item_key("never-chosen")
    assert cold in all_keys.tolist() and len(all_keys) == len(seen) + 1
    # a row is the id row (the default row for an item nobody chose) plus the slots' means
    g1 = model.attrs.params.lookup(tf.constant(slot_keys(SPEC.by_name["genres"], ["g1"]))).numpy()
    row = model.default_row(model.items) + g1[0]
    first = item_key(seen[1])
    k, w = attribute_row(SPEC, catalogue[1][1], 4)
    a_rows = model.attrs.params.lookup(tf.constant(k[w > 0])).numpy()
    want = model.items.params.lookup(tf.constant([first])).numpy()[0] + (w[w > 0, None] * a_rows).sum(0)
    np.testing.assert_allclose(model.item_rows(tf.constant([first])).numpy()[0], want, rtol=1e-5,
                               atol=1e-6)
    # the towers' part scores the composed rows (normalised)
    at = all_keys.tolist().index(cold)
    np.testing.assert_allclose(tower[at], row / np.linalg.norm(row), rtol=1e-4, atol=1e-6)
    # the attribute rows are stored (a key without a row draws a fresh one at each lookup)
    again = model.attrs.params.lookup(tf.constant(slot_keys(SPEC.by_name["genres"], ["g1"])))
    np.testing.assert_array_equal(again.numpy(), g1)


def test_attributes_need_the_dedup_step() -> None:
    with pytest.raises(ValueError, match="dedup_lookups"):
        Trainer(ModelConfig(attr_tokens=4), TrainOptions(dedup_lookups=False), tag="attrs_single")


def test_rows_of_attribute_keys_no_item_names_are_evicted() -> None:
    """An item that leaves the catalogue (or changes its attributes) leaves its keys' rows
    behind; the trainer's eviction drops the rows no item names, with their optimizer
    slots, and keeps every named one as it was."""
    history_len, batch_size = 10, 64
    stream = SyntheticStream(SyntheticConfig(users=100, items=40, clusters=4,
                                             history_len=history_len))
    samples = stream.take(batch_size)
    trainer = Trainer(
        ModelConfig(history_len=history_len, attr_tokens=4, prior_weight=0.0,
                    attr_admit_after=1),
        TrainOptions(batch_size=batch_size, eval_rows=0, evict_every_steps=1),
        tag="attr_evict",
    )
    first, *rest = sorted({s.item_id for s in samples})
    trainer.set_catalogue(SPEC, [(first, {"genres": ["g1"], "tags": ["only-first"]})]
                          + [(i, {"genres": ["g1"], "tags": ["shared"]}) for i in rest])
    model = trainer.model
    assert model.attrs is not None
    trainer.train_step(to_batch(samples, history_len, KeyCache()))
    only = slot_keys(SPEC.by_name["tags"], ["only-first"])[0]
    kept = np.asarray(slot_keys(SPEC.by_name["tags"], ["shared"])
                      + slot_keys(SPEC.by_name["genres"], ["g1"]), np.int64)
    slots = trainer._slot_tables(trainer.opt_attr, model.attrs)
    assert slots and only in slots[0].export()[0].numpy().tolist()  # the step gave it a slot
    before = model.attrs.params.lookup(tf.constant(kept)).numpy()
    assert trainer.maybe_evict() == 0 and trainer.evicted_attr_rows == 0  # all named
    trainer.remove_catalogue([first])
    trainer.maybe_evict()
    assert trainer.evicted_attr_rows == 1
    held = model.attrs.params.export()[0].numpy().tolist()
    assert only not in held and sorted(held) == sorted(kept.tolist())
    assert only not in slots[0].export()[0].numpy().tolist()
    np.testing.assert_array_equal(model.attrs.params.lookup(tf.constant(kept)).numpy(), before)
    # an evicted key no step reads again is left out of the rows sent, not drawn afresh
    keys, rows = trainer.attribute_rows(np.asarray([only, *kept.tolist()]))
    assert keys.tolist() == sorted(kept.tolist()) and rows.shape == (2, 32)
    # named again: a row of its own again
    trainer.set_catalogue(SPEC, [("back", {"tags": ["only-first"]})])
    assert only in model.attrs.params.export()[0].numpy().tolist()


def test_attribute_keys_are_admitted_once_enough_items_name_them() -> None:
    """A key named by fewer than ``attr_admit_after`` catalogued items has no row and adds
    nothing; the items naming a key whose admission changes are reported (their entries go
    out again), and the parts versions and serving compute equal the towers' own."""
    trainer = Trainer(ModelConfig(history_len=10, attr_tokens=4, prior_weight=0.0,
                                  attr_admit_after=2),
                      TrainOptions(batch_size=16, eval_rows=0, evict_every_steps=1),
                      tag="attr_admit")
    model = trainer.model
    assert model.attrs is not None and model.config.attr_admit_after == 2
    heard: list[list[int]] = []
    trainer.on_catalogue = lambda keys: heard.append(sorted(np.asarray(keys).tolist()))
    a, b, c = item_key("a"), item_key("b"), item_key("c")
    trainer.set_catalogue(SPEC, [("a", {"genres": ["g"], "title": "Alpha Common"}),
                                 ("b", {"genres": ["g"], "title": "Beta Common"})])
    g = slot_keys(SPEC.by_name["genres"], ["g"])[0]
    alpha, beta, common = slot_keys(SPEC.by_name["title"], ["alpha", "beta", "common"])
    held = sorted(model.attrs.params.export()[0].numpy().tolist())
    assert held == sorted([g, common]) and heard == [sorted([a, b])]
    tokens, weights = trainer.attribute_entries(np.asarray([a]))
    assert dict(zip(tokens[0].tolist(), weights[0].tolist(), strict=True)) == {
        g: 1.0, alpha: 0.0, common: 0.5, 0: 0.0}
    assert model.admitted(np.asarray([g, alpha, beta, common])).tolist() == [
        True, False, False, True]

    def parts_agree(keys: list[int]) -> None:  # numpy (versions, serving) against the towers
        np.testing.assert_allclose(trainer.attribute_parts(np.asarray(keys)),
                                   model.attr_part(tf.constant(keys, tf.int64)).numpy(),
                                   rtol=1e-6, atol=1e-7)

    parts_agree([a, b])
    # a third item names "alpha": admitted, a row of its own, and "a" is heard again
    trainer.set_catalogue(SPEC, [("c", {"title": "Alpha"})])
    assert heard[-1] == sorted([a, c]) and alpha in model.attrs.params.export()[0].numpy()
    assert trainer.attribute_entries(np.asarray([a]))[1][0].tolist() == [1.0, 0.5, 0.5, 0.0]
    parts_agree([a, b, c])
    # the counts are derived again after a restore: the same admission; a checkpoint from
    # before admission (no given weights) takes them from the entries' weights
    before = model.attribute_counts()
    model.attributes_restored()
    for got, want in zip(model.attribute_counts(), before, strict=True):
        np.testing.assert_array_equal(got, want)
    abc = tf.constant([a, b, c], tf.int64)
    given, weighed = model.attr_given.lookup(abc).numpy(), model.attr_weights.lookup(abc).numpy()
    assert not np.array_equal(given, weighed)  # "beta" (b's alone) weighs 0
    model.attr_given.remove(abc)
    model.attr_weights.insert(abc, tf.constant(given))
    model.attributes_restored()
    np.testing.assert_array_equal(model.attr_given.lookup(abc).numpy(), given)
    np.testing.assert_array_equal(model.attr_weights.lookup(abc).numpy(), weighed)
    for got, want in zip(model.attribute_counts(), before, strict=True):
        np.testing.assert_array_equal(got, want)
    # "c" leaves: "alpha" is named by one item again, "a" weighs it 0, its row is evicted
    trainer.remove_catalogue(["c"])
    assert heard[-1] == sorted([a, c])
    assert trainer.attribute_entries(np.asarray([a]))[1][0].tolist() == [1.0, 0.0, 0.5, 0.0]
    trainer.maybe_evict()
    assert trainer.evicted_attr_rows == 1
    assert alpha not in model.attrs.params.export()[0].numpy().tolist()
    parts_agree([a, b])
    # an item whose every key is below admission is still catalogued: a candidate
    trainer.set_catalogue(SPEC, [("lone", {"title": "Unique"})])
    assert model.has_attributes(np.asarray([item_key("lone")])).tolist() == [True]
    assert item_key("lone") in trainer.item_parts()[0].tolist()
