"""How the full suite's xdist workers share the cores (tests/conftest.py): each worker
an equal share, none left without a core, none sharing one while another is free."""

from __future__ import annotations

import pytest

from tests.conftest import worker_cores


@pytest.mark.parametrize(("cores", "workers"), [(2, 2), (16, 2), (16, 16), (3, 2), (1, 1)])
def test_the_workers_split_the_cores_between_them(cores: int, workers: int) -> None:
    shares = [worker_cores(list(range(cores)), worker, workers) for worker in range(workers)]
    assert all(shares)
    assert sorted(core for share in shares for core in share) == list(range(cores))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_more_workers_than_cores_share_them_round_robin() -> None:
    shares = [worker_cores([4, 5], worker, 5) for worker in range(5)]
    assert shares == [[4], [5], [4], [5], [4]]
