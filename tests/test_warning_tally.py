"""WarningTally: a task's warnings counted by kind, shown once, kept for its result."""

import warnings

from pyro_bnnlv._warning_tally import WarningTally


def test_counts_each_kind_shows_it_once_and_restores_the_warning_machinery():
    before = warnings.showwarning
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with WarningTally() as tally:
            for i in range(3):
                warnings.warn("jitter 1e-6 added to the diagonal " + "x" * 80 + str(i), RuntimeWarning)
            warnings.warn("grid edge", UserWarning)
            warnings.warn("grid edge", UserWarning)
    assert warnings.showwarning is before
    assert [str(w.message)[:9] for w in shown] == ["jitter 1e", "grid edge"]  # first of each kind
    assert (
        tally.summary().startswith("3x RuntimeWarning: jitter 1e-6 added")
        and "; 2x UserWarning: grid edge" in tally.summary()
    )
    assert len(tally.summary(limit=20)) == 20
    with WarningTally() as quiet:
        pass
    assert quiet.summary() == ""
