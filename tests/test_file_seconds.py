"""The suite's schedule: test files longest first (tests/file_seconds.py)."""
from tests.file_seconds import main, read_table, seconds_by_file


def test_seconds_are_summed_per_file_from_a_durations_log(tmp_path):
    log = ["============ slowest durations ============",
           "12.50s setup    tests/scale/test_strategies.py::test_a[fsdp]",
           "3.25s call     tests/scale/test_strategies.py::test_a[fsdp]",
           "0.25s teardown tests/cli/test_configs.py::test_b",
           "1993 passed in 1013.98s (0:16:53)"]
    assert seconds_by_file(log) == {"tests/scale/test_strategies.py": 15.8, "tests/cli/test_configs.py": 0.2}
    empty = tmp_path / "empty.log"
    empty.write_text("1 passed\n")
    assert main([str(empty)]) == 1  # a log without --durations=0 lines never blanks the table


def test_the_suite_runs_its_longest_files_first(request):
    table = read_table()
    assert len(table) > 50 and all(seconds >= 0 for seconds in table.values())
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in request.session.items))
    listed = [f for f in files if f in table]
    assert listed == sorted(listed, key=lambda f: -table[f])  # longest first ...
    assert files[:len(listed)] == listed  # ... and files not in the table (new ones) after them
