"""Numbers over seeds (``experiments.stats``): hand-computed means, standard deviations, t intervals, the bootstrap,
and the paired tests; one seed is an observation without an interval; bad seeds are one line."""
import math

import pytest

from ptm_app.errors import PtmError
from ptm_app.experiments.stats import check_seeds, paired, summarize


def test_the_t_interval_is_mean_plus_minus_t_s_over_root_n():
    s = summarize([0.80, 0.82, 0.84])
    assert s.mean == pytest.approx(0.82) and s.std == pytest.approx(0.02)
    half = 4.302652729911275 * 0.02 / math.sqrt(3)  # t_{0.975, 2}
    assert s.interval == pytest.approx((0.82 - half, 0.82 + half))
    assert s.text(3) == f"0.820 ± 0.020 [{0.82 - half:.3f}, {0.82 + half:.3f}] (3 seeds)"


def test_one_seed_is_an_observation_and_the_bootstrap_stays_within_the_values():
    one = summarize([0.7])
    assert one.interval is None and one.std == 0.0 and "an observation" in one.text()
    boot = summarize([0.1, 0.2, 0.3, 0.9], method="bootstrap")
    assert 0.1 <= boot.interval[0] < boot.mean < boot.interval[1] <= 0.9
    assert summarize([0.1, 0.2, 0.3, 0.9], method="bootstrap") == boot  # seeded


def test_paired_tests_on_the_same_seeds():
    better = paired([0.9, 0.8, 0.85, 0.95], [0.8, 0.7, 0.75, 0.85])  # +0.1 on every seed
    assert better.diff.mean == pytest.approx(0.1) and better.significant and better.p_t < 1e-12
    assert better.p_perm == pytest.approx(2 / 16)  # all + or all - of 16 sign flips
    noise = paired([0.5, 0.6, 0.4], [0.55, 0.5, 0.45])
    assert not noise.significant and noise.p_perm == pytest.approx(1.0)  # |sum| = 0.0: every flip is as extreme
    assert 0.0 < noise.p_t <= 1.0
    with pytest.raises(PtmError, match="same seeds on both sides"):
        paired([1, 2], [1])


def test_seeds_must_be_distinct_integers():
    assert check_seeds([1, 2, 3]) == [1, 2, 3]
    for bad, message in (([1, "2"], "'2' is not an integer seed"), ([1.5], "1.5 is not an integer"),
                         ([1, 1], "seed 1 is given twice"), ([], "give a list of integer seeds"),
                         ([True], "True is not an integer seed")):
        with pytest.raises(PtmError, match=message):
            check_seeds(bad, "seeds")
