"""Mixing matrices and sigma2 on hand-checked cases."""

import math

import numpy as np
import pytest

from ina_fabric.host.schedule.model import Round, mixing_matrix, sigma2, objective
from ina_fabric.host.schedule.search import k_partitions, mixed_radix


def test_clique_matrix_is_block_average():
    w = mixing_matrix(Round.cliques([(0, 1), (2, 3, 4)], 5))
    expect = np.zeros((5, 5))
    expect[:2, :2] = 1 / 2
    expect[2:, 2:] = 1 / 3
    assert np.allclose(w, expect)


def test_all_to_all_is_exact_average():
    assert sigma2([mixing_matrix(Round.cliques([range(6)], 6))]) == pytest.approx(0, abs=1e-12)


def test_static_pairs_never_converge():
    # {0,1},{2,3} repeated: the two pairs never talk, sigma2 = 1 however often it repeats
    w = mixing_matrix(Round.cliques([(0, 1), (2, 3)], 4))
    assert sigma2([w] * 5) == pytest.approx(1.0)


def test_hypercube_pairs_exact_in_two_rounds():
    r1 = Round.cliques([(0, 1), (2, 3)], 4)
    r2 = Round.cliques([(0, 2), (1, 3)], 4)
    assert sigma2([mixing_matrix(r1)]) == pytest.approx(1.0)
    assert sigma2([mixing_matrix(r1), mixing_matrix(r2)]) == pytest.approx(0, abs=1e-12)


def test_ring_gossip_sigma2_one_third():
    # W = (I + P + P^T)/3 on a 4-cycle: eigenvalues 1, 1/3, 1/3, -1/3 -> sigma2 = 1/3
    inb = tuple(tuple(sorted({(i - 1) % 4, (i + 1) % 4})) for i in range(4))
    w = mixing_matrix(Round(inb))
    assert np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1)
    assert sigma2([w]) == pytest.approx(1 / 3)


def test_one_peer_exponential_exact_for_power_of_two():
    # (I+P)/2 then (I+P^2)/2 on 4 nodes = (I+P+P^2+P^3)/4 = J
    r0 = Round(tuple(((i + 1) % 4,) for i in range(4)))
    r1 = Round(tuple(((i + 2) % 4,) for i in range(4)))
    assert sigma2([mixing_matrix(r0)]) == pytest.approx(math.sqrt(0.5))  # |(1+i)/2|
    assert sigma2([mixing_matrix(r0), mixing_matrix(r1)]) == pytest.approx(0, abs=1e-12)


def test_three_by_three_grid_exact_in_two_rounds():
    rows = Round.cliques([(0, 1, 2), (3, 4, 5), (6, 7, 8)], 9)
    cols = Round.cliques([(0, 3, 6), (1, 4, 7), (2, 5, 8)], 9)
    assert sigma2([mixing_matrix(rows)]) == pytest.approx(1.0)
    assert sigma2([mixing_matrix(rows), mixing_matrix(cols)]) == pytest.approx(0, abs=1e-12)


def test_sigma2_is_on_disagreement_subspace():
    # a lazy pair on 2 nodes: W = [[3/4,1/4],[1/4,3/4]], eigenvalues 1 and 1/2
    w = np.array([[0.75, 0.25], [0.25, 0.75]])
    assert sigma2([w]) == pytest.approx(0.5)
    assert sigma2([w, w, w]) == pytest.approx(0.125)


def test_objective_floor_and_rate():
    assert objective(0.5, 2.0, 1e-3) == pytest.approx(math.log(2) / 2)
    assert objective(0.0, 1.0, 1e-3) == pytest.approx(-math.log(1e-3))
    assert objective(0.5, math.inf, 1e-3) == 0.0


@pytest.mark.parametrize("n,k,count", [(4, 2, 3), (6, 2, 15), (6, 3, 10), (9, 3, 280),
                                        (9, 2, 945), (5, 2, 15), (7, 3, 70)])
def test_k_partitions_counts(n, k, count):
    parts = list(k_partitions(n, k))
    assert len(parts) == count
    canon = {tuple(sorted(tuple(sorted(b)) for b in p)) for p in parts}
    assert len(canon) == count
    assert all(sorted(x for b in p for x in b) == list(range(n)) for p in parts)


def test_mixed_radix_exact_when_n_is_power_of_k():
    for n, k in [(8, 2), (9, 3), (16, 4)]:
        rounds = [Round.cliques(g, n) for g in mixed_radix(list(range(n)), k)]
        assert len(rounds) == round(math.log(n, k))
        assert sigma2([mixing_matrix(r) for r in rounds]) == pytest.approx(0, abs=1e-10)
