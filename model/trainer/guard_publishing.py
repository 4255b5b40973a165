"""The trainer service's side of the quality guard (``model.trainer.guard_rule``): what it does
with a decision — metrics, log lines with the figures, the registry's pin of the healthy
version on a rollback (dropped once the first version after the resume is out), the
``GUARD.json`` note serving's ``/model`` and ``/health`` show, and the hold's age (a
degraded ``/health`` past ``trainer.guard_hold_alarm_s``). No TensorFlow."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from model.artifact.guard_note import hold_reason
from model.artifact.registry import Registry, RegistryError
from model.trainer.guard_rule import Decision, Guard
from model.trainer.metrics import TrainerMetrics

log = logging.getLogger(__name__)


class _Lineage(Protocol):
    def reset(self) -> None: ...


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


class GuardedPublishing:
    """Acts on the guard's decisions for one trainer service's registry."""

    def __init__(self, guard: Guard, registry: Registry, metrics: TrainerMetrics,
                 clock: Callable[[], datetime], alarm_s: float = 60.0) -> None:
        """``alarm_s``: a hold lasting longer degrades ``/health`` (:meth:`degraded`)."""
        self.guard = guard
        self.registry = registry
        self.metrics = metrics
        self.clock = clock
        self.alarm_s = alarm_s
        #: The version the guard pinned CURRENT to (a rollback), until it resumes.
        self.pin: str | None = None
        metrics.guard_held_seconds.set_function(self.held_seconds)

    def held_seconds(self) -> float:
        """Seconds the current hold has lasted (0: not holding), read at each scrape."""
        return self.guard.held_for_s(self.clock()) or 0.0

    def status(self) -> dict[str, Any]:
        return {**self.guard.status(self.clock()), "pinned": self.pin,
                "hold_alarm_s": self.alarm_s}

    def degraded(self) -> list[str]:
        """Why ``/health`` is degraded by the guard: a hold older than ``alarm_s``."""
        held_at = self.guard.held_at if self.guard.held else None
        reason = hold_reason(held_at, self.clock(), self.alarm_s)
        return [reason] if reason else []

    def to_json(self) -> dict[str, Any]:
        """The guard's state and its pin, for the trainer checkpoint (``LoopState.guard``)."""
        return {**self.guard.to_json(), "pin": self.pin}

    def restore(self, data: dict[str, Any]) -> None:
        """After a restart: the guard's state and pin as checkpointed (a hold goes on, and
        its rollback pin is still dropped when the guard resumes)."""
        self.guard.restore(data, now=self.clock())
        pin = data.get("pin")
        self.pin = str(pin) if pin else None
        self.metrics.guard_held.set(1 if self.guard.held else 0)
        if self.guard.reference is not None:
            self.metrics.guard_recall.labels("healthy").set(self.guard.reference)
        if self.guard.held:
            log.warning("quality guard: restored HOLDING (healthy recall %s, pin %s)",
                        _fmt(self.guard.reference), self.pin or "none")

    def allows(self, deltas: _Lineage | None) -> bool:
        """Ask the guard before a publication (every trained batch's head scored); True =
        publish. Logs and acts on a hold (a rollback pin when a suspect state was served)
        and on a resume (``deltas``: the lineage a resume after a rollback starts again)."""
        d = self.guard.check(self.clock())
        m = self.metrics
        if d.current is not None:
            m.guard_recall.labels("current").set(d.current)
        if d.reference is not None:
            m.guard_recall.labels("healthy").set(d.reference)
        if d.action == "hold":
            m.guard_holds.inc()
            m.guard_held.set(1)
            log.warning("quality guard HOLDS publication: %s (healthy recall %s, %d rows "
                        "scored); suspect publications: %s", d.reason, _fmt(d.reference),
                        d.scored, ", ".join(d.suspect) or "none")
            self.rollback(d)
        elif d.action == "held" and d.reason:
            log.warning("quality guard still HOLDS publication: %s", d.reason)
        elif d.action == "resume":
            m.guard_held.set(0)
            log.warning("quality guard RESUMES publication: %s (healthy recall %s)",
                        d.reason, _fmt(d.reference))
            self.resume(deltas)
        if d.action in ("hold", "resume"):
            self.note(d)
        return d.publishes

    def published(self, name: str, *, full: bool) -> None:
        """A delta (``base#seq``) or a full version went out; the first full version after
        a rollback's resume drops the guard's pin."""
        self.guard.published(name, full=full)
        if full and self.pin is not None and not self.guard.held:
            self.unpin()

    def note(self, d: Decision) -> None:
        """The guard's state beside CURRENT, for serving's ``/model`` (best effort)."""
        try:
            self.registry.write_guard({
                "held": d.action == "hold", "action": d.action, "reason": d.reason,
                "held_since": (self.guard.held_at.isoformat()
                               if d.action == "hold" and self.guard.held_at else None),
                "current_recall": d.current, "healthy_recall": d.reference,
                "suspect": list(d.suspect), "pinned": self.pin,
                "at": self.clock().isoformat(),
            })
        except OSError as exc:
            log.warning("quality guard: could not write its note: %s", exc)

    def rollback(self, d: Decision) -> None:
        if not d.suspect:
            return
        if d.rollback_to is None:
            log.error("quality guard: no full version predates the evidence; serving stays "
                      "on %s", self.registry.current())
            return
        pinned = self.registry.pinned()
        if pinned is not None and pinned != self.pin:
            log.warning("quality guard: CURRENT is pinned to %s by hand; no rollback", pinned)
            return
        try:
            kept = set(self.registry.versions())
            # the newest full version before the evidence that retention has not pruned
            target = next((v for v in d.older_versions or (d.rollback_to,) if v in kept), None)
            if target is None:
                log.error("quality guard: no full version before the evidence is left in the "
                          "registry (%s pruned); serving stays on %s", d.rollback_to,
                          self.registry.current())
                return
            self.registry.pin(target)
        except (RegistryError, OSError) as exc:
            log.error("quality guard: rollback to %s failed: %s", d.rollback_to, exc)
            return
        self.pin = target
        self.metrics.guard_rollbacks.inc()
        log.warning("quality guard ROLLED BACK serving to %s (healthy recall %s; suspect: %s)",
                    target, _fmt(d.reference), ", ".join(d.suspect))

    def resume(self, deltas: _Lineage | None) -> None:
        """After a rollback: a new full version (a new lineage) comes next, and the pin is
        dropped once it is published (:meth:`unpin`), so CURRENT goes from the healthy
        version straight to it, never back to a suspect one."""
        if self.pin is None:
            return  # serving stayed on the last healthy state: the lineage goes on
        if deltas is not None:
            deltas.reset()  # the loop exports at once (without deltas: it is exporting)

    def unpin(self) -> None:
        pin, self.pin = self.pin, None
        try:
            if pin is not None and self.registry.pinned() == pin:
                self.registry.unpin()
                self.registry.write_guard({**(self.registry.guard() or {}), "pinned": None})
                log.warning("quality guard: pin of %s dropped, serving follows %s", pin,
                            self.registry.current())
        except (RegistryError, OSError) as exc:
            log.error("quality guard: unpin of %s failed: %s", pin, exc)
