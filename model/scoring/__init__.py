"""Numpy terms of the retrieval score, shared by the trainer's export, evaluation and serving.

* ``pooling`` — the user tower's history pooling in numpy (the served twin of the TF one).
* ``prior`` — the popularity prior folded into the dot product.
* ``covisit`` — the item co-visitation term and its streaming state.
* ``topk`` — exact top-k selection: serving's pruned search and the evaluation's ranking.
* ``ann`` — candidates for large catalogues: an IVF-Flat index (faiss) over a version's item
  vectors, followed through the version's deltas; the union ranked by the exact score.
* ``attention`` — the attention user tower in numpy (the served twin of the TF one).
* ``mixer`` — the learned weights of the score's parts.
* ``selector`` — per history size, the scales of the neighbour parts' weights that hit most.
* ``rarity`` — per item count group (never chosen, 1-4 positives), the towers' scale that hits
  most, folded into the served item vectors.
* ``sessions`` — the session-kNN part and its index of recent histories.
* ``cold`` — what a row with no history is ranked by: the mix, the prior or all-time
  popularity alone.
* ``attributes`` — an item's attribute part (catalogue slots), composed alike by versions,
  deltas and serving.

Numpy only: never imports TensorFlow (a test checks it).
"""
