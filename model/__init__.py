"""The TFRA two-tower model, its incremental trainer, and the version artifact + registry.

Nothing is re-exported here on purpose: ``import model`` must not load TensorFlow, because
serving imports the numpy-only reader (``model.artifact``, ``model.registry``). Import the
trainer from ``model.trainer`` / ``model.trainer_loop``.
"""
