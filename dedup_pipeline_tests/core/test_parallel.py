"""ordered_map: worker processes, results in input order, bounded look-ahead, errors and early exits."""

from __future__ import annotations

import multiprocessing
import operator

import pytest

from dedup_pipeline.core.parallel import available_cpus, ordered_map


def test_results_come_back_in_input_order_from_worker_processes():
    items = list(range(-50, 50))
    assert list(ordered_map(operator.neg, items, workers=2)) == [-i for i in items]
    assert not multiprocessing.active_children()  # the pool is shut down once the input is used up


def test_one_worker_runs_inline_without_a_pool():
    assert list(ordered_map(operator.neg, [1, 2, 3], workers=1)) == [-1, -2, -3]
    assert not multiprocessing.active_children()


def test_a_workers_exception_is_raised_where_its_result_is_reached():
    results = ordered_map(int, ["1", "2", "not a number", "4"], workers=2)
    assert next(results) == 1 and next(results) == 2
    with pytest.raises(ValueError, match="not a number"):
        next(results)
    assert not multiprocessing.active_children()


def test_the_input_is_read_only_a_few_items_ahead():
    pulled = []

    def items():
        for i in range(1000):
            pulled.append(i)
            yield i

    results = ordered_map(operator.neg, items(), workers=2)
    assert next(results) == 0
    assert len(pulled) <= 2 * 2 + 1  # memory bounded by the workers, not by the input
    results.close()  # leaving early cancels what is queued and stops the workers
    assert len(pulled) < 1000
    assert not multiprocessing.active_children()


def _in_a_daemon(queue) -> None:
    from dedup_pipeline.core.parallel import can_start_processes

    queue.put((can_start_processes(), list(ordered_map(operator.neg, range(5), workers=2))))


def test_a_daemonic_process_such_as_a_celery_worker_runs_inline():
    """Daemonic processes may not have children: the work runs in the process itself instead of failing."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    daemon = context.Process(target=_in_a_daemon, args=(queue,), daemon=True)
    daemon.start()
    allowed, results = queue.get(timeout=60)
    daemon.join(timeout=60)
    assert (allowed, results) == (False, [0, -1, -2, -3, -4])


def test_available_cpus_counts_at_least_one():
    assert available_cpus() >= 1
