"""Scripts that reproduce the papers' tables at a size that fits a small machine.

* :mod:`pyro_bnnlv.reproduce.in_between`: Foong, Li, Hernández-Lobato & Turner (2019),
  arXiv:1906.11537, Tables 1-2 (UCI standard and gap splits; MAP, MFVI, linearised and sampled
  Laplace). Run ``python -m pyro_bnnlv.reproduce.in_between --help``.
* :mod:`pyro_bnnlv.reproduce.ncai_compare`: the NCAI paper's comparison on one data set
  (``pyro-bnnlv compare DATASET``); :mod:`pyro_bnnlv.reproduce.ncai` its protocol over the five
  synthetic sets (``pyro-bnnlv reproduce ncai``).
* :mod:`pyro_bnnlv.reproduce.invariance`: the invariance paper's SVI and NUTS checks on the
  over-parametrised linear model, and its Fig. 1-2.
* :mod:`pyro_bnnlv.reproduce.classification`: classifiers against NUTS on two moons (MFVI, FCVI,
  MAP, linearised Laplace of every structure; Immer et al. 2021, arXiv:2008.08400) and a CNN on
  digits with OOD digits (MAP, K-FAC Laplace, MFVI; ``pyro-bnnlv reproduce classification``).
"""
