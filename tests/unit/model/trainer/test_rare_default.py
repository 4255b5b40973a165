"""Whether the trainer scales the towers' part on rare items (``ModelConfig.rare_select``):
on with attribute slots unless set, never with a fixed mix."""

from __future__ import annotations

from model.scoring.rarity import RareSelector
from model.towers.config import ModelConfig
from model.trainer.trainer import _rarity


def test_the_selector_is_on_with_attribute_slots_unless_set() -> None:
    assert _rarity(ModelConfig()) is None  # ids only: off (the real-log panel)
    assert isinstance(_rarity(ModelConfig(attr_tokens=4)), RareSelector)
    assert isinstance(_rarity(ModelConfig(rare_select=True)), RareSelector)
    assert _rarity(ModelConfig(attr_tokens=4, rare_select=False)) is None
    assert _rarity(ModelConfig(attr_tokens=4, mix="fixed")) is None
