"""Numpy terms of the retrieval score, shared by the trainer's export, evaluation and serving.

* ``pooling`` — the user tower's history pooling in numpy (the served twin of the TF one).
* ``prior`` — the popularity prior folded into the dot product.
* ``covisit`` — the item co-visitation term and its streaming state.

Numpy only: never imports TensorFlow (a test checks it).
"""
