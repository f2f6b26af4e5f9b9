"""Scripts that reproduce the papers' tables at a size that fits a small machine.

* :mod:`pyro_bnnlv.reproduce.in_between`: ``in-between-uncertainty-linearised-laplace.txt``
  Tables 1-2 (UCI standard and gap splits; MAP, MFVI, linearised and sampled Laplace).
  Run ``python -m pyro_bnnlv.reproduce.in_between --help``.
"""
