"""hpcckpt.online_decision.decide (pure): who takes which lost rank number, and when recovery must stop."""
from hpcckpt.online_decision import decide


def test_one_lost_rank_goes_to_the_first_spare():
    # 4 workers + 2 spares (original ranks 4, 5); worker 1 (original rank 1) is gone
    table = [(0, 0, 1, 0), (2, 2, 1, 0), (3, 3, 1, 0), (-1, 5, 0, 0), (-1, 4, 0, 0)]
    assert decide(table, 4, 6) == (None, {4: 1}, True)


def test_lost_numbers_in_order_to_spares_in_order():
    table = [(1, 1, 0, 0), (3, 3, 0, 0), (-1, 7, 0, 0), (-1, 5, 0, 0), (-1, 6, 0, 0)]
    assert decide(table, 4, 7) == (None, {5: 0, 6: 2}, False)


def test_a_second_recovery_sees_a_promoted_spare_as_a_worker():
    # spare 4 took number 1 in the first recovery; now number 3 (original rank 3) is lost
    table = [(0, 0, 1, 0), (1, 4, 1, 0), (2, 2, 1, 0), (-1, 5, 1, 0)]
    assert decide(table, 4, 5) == (None, {5: 3}, True)


def test_more_lost_than_spares_is_an_error_naming_the_numbers():
    error, assign, _ = decide([(0, 0, 1, 0), (3, 3, 1, 0), (-1, 4, 0, 0)], 4, 5)
    assert assign == {}
    assert "2 of the 4 worker ranks are lost (numbers 1, 2)" in error and "only 1 spare process is left" in error


def test_a_lost_spare_only_reassigns_nothing():
    assert decide([(0, 0, 1, 0), (1, 1, 1, 0), (-1, 3, 0, 0)], 2, 4) == (None, {}, True)


def test_an_mpi_error_without_a_lost_process_is_not_retried():
    error, assign, _ = decide([(0, 0, 1, 0), (1, 1, 1, 0), (-1, 2, 0, 0)], 2, 3, cause="Exception: MPI_ERR_OTHER")
    assert assign == {} and "no process failed" in error and "MPI_ERR_OTHER" in error


def test_an_exception_on_any_process_ends_the_job_without_replacing_anyone():
    # worker 1 raised (its row says so); worker 2 is also gone: nobody is replaced, the job ends
    error, assign, committed = decide([(0, 0, 1, 0), (1, 1, 1, 1), (3, 3, 1, 0), (-1, 4, 0, 0)], 4, 5)
    assert assign == {} and committed
    assert error.startswith("worker 1 (world rank 1) raised an exception") and "does not retry" in error
    error, _, _ = decide([(0, 0, 0, 1), (1, 1, 0, 1), (2, 2, 0, 1), (-1, 3, 0, 0)], 3, 4)
    assert error.startswith("worker 0 (world rank 0) and 2 more processes raised")
