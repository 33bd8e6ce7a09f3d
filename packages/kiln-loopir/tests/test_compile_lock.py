"""Compiles in two threads take turns (kiln_loopir.compile_lock): one works while the other
waits, never both at once."""

import threading

from kiln_loopir import compile_lock


def test_a_compile_waiting_lets_the_other_work_and_none_work_at_once():
    working: list[str] = []  # who works, as each step starts
    at_once: list[int] = []
    inside = [0]
    other_started = threading.Event()

    def work(who: str) -> None:
        with compile_lock.compiling():
            inside[0] += 1
            at_once.append(inside[0])
            working.append(who)
            inside[0] -= 1

    def other() -> None:
        other_started.set()
        work("other")

    # held again by the same thread: no deadlock
    with compile_lock.compiling(), compile_lock.compiling():
        work("first")
        thread = threading.Thread(target=other)
        thread.start()
        other_started.wait()
        with compile_lock.waiting():  # the other thread works meanwhile
            thread.join(timeout=30)
        assert not thread.is_alive(), "the other compile never got the lock"
        work("first")
    assert working == ["first", "other", "first"]
    assert set(at_once) == {1}


def test_waiting_outside_a_compile_holds_nothing():
    with compile_lock.waiting(), compile_lock.compiling():
        pass
    done = threading.Event()

    def compile_in_a_thread() -> None:
        with compile_lock.compiling():
            done.set()

    threading.Thread(target=compile_in_a_thread, daemon=True).start()
    assert done.wait(timeout=30), "a waiting() outside compiling() left the lock taken"


def test_a_compile_given_the_first_turn_works_until_its_first_wait():
    steps: list[str] = []
    handed_over = threading.Event()
    waits = threading.Event()  # what the other compile waits for (a worker, say)

    def other() -> None:
        with compile_lock.compiling(handed_over):
            steps.append("other works")
            with compile_lock.waiting():
                steps.append("other waits")
                waits.wait(timeout=30)
            steps.append("other works again")

    with compile_lock.compiling():
        thread = threading.Thread(target=other)
        thread.start()
        compile_lock.first_turn(handed_over)
        steps.append("first works")
        waits.set()
        with compile_lock.waiting():
            thread.join(timeout=30)
        steps.append("first works again")
    assert steps == [
        "other works", "other waits", "first works", "other works again", "first works again"
    ]  # fmt: skip


def test_the_first_turn_ends_with_a_compile_that_never_waits_or_fails():
    handed_over = threading.Event()

    def failing() -> None:
        try:
            with compile_lock.compiling(handed_over):
                raise RuntimeError("a compile that fails")
        except RuntimeError:
            pass

    with compile_lock.compiling():
        threading.Thread(target=failing).start()
        compile_lock.first_turn(handed_over)  # returns: the lock was let go at the end
    assert handed_over.is_set()
