"""Selection of the fault matrix (tests/mpi/test_fault_matrix.py): the default subset, one
rotating slice of the other cases, or all of them (RELIABILITY_FULL=1); the rule is
reliability.select, described in test_fault_matrix's docstring. Cases not selected are
deselected (counted in pytest's "deselected"), not skipped; one line after "collected" and one
in the summary say which slice ran and how to rerun it."""
import os

import pytest

import reliability

_KEY = pytest.StashKey()


def _named(config):
    """(file name, test[params]) of the items named by their full node id on the command line."""
    out = set()
    for arg in config.args:
        if "::" in arg and "[" in arg:
            path, rest = arg.split("::", 1)
            out.add((os.path.basename(path), rest))
    return out


def pytest_collection_modifyitems(config, items):
    marked = [it for it in items if it.get_closest_marker("matrix")]
    if not marked:
        return
    universe = marked[0].module.MATRIX_KEYS      # the whole matrix, whatever was collected
    try:
        sel = reliability.select([k for k, d in universe.items() if d], [k for k, d in universe.items() if not d])
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    named = _named(config)
    keep, drop = [], []
    for it in items:
        m = it.get_closest_marker("matrix")
        if m is None or m.args[0] in sel.keys or (it.path.name, it.nodeid.split("::", 1)[1]) in named:
            keep.append(it)
        else:
            drop.append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    config.stash[_KEY] = [sel, None]


def pytest_report_collectionfinish(config, items):
    state = config.stash.get(_KEY, None)
    if state is None:
        return None
    sel = state[0]
    keys = [it.get_closest_marker("matrix").args[0] for it in items if it.get_closest_marker("matrix")]
    defaults = sum(1 for k in keys if k in sel.defaults or sel.full)
    in_slice = sum(1 for k in keys if k in sel.slice_keys)
    state[1] = sel.line(defaults, in_slice, named=sum(1 for k in keys if k not in sel.keys))
    return state[1]


def pytest_terminal_summary(terminalreporter, config):
    state = config.stash.get(_KEY, None)
    if state is not None and state[1]:
        terminalreporter.write_sep("-", "fault matrix")
        terminalreporter.write_line(state[1])
