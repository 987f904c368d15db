"""Local inputs in every supported format, and hub ids refused clearly when offline."""
import json

import pytest

from ptm_app.data.datamodules import resolve_source
from ptm_app.data.formats import read_records
from ptm_app.errors import PtmError


def test_csv_tsv_txt_parquet_and_jsonl_give_the_same_records(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": "first doc", "label": "a"}, {"text": "second, with a comma", "label": "b"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.csv").write_text('text,label\nfirst doc,a\n"second, with a comma",b\n')
    (tmp_path / "d.tsv").write_text("text\tlabel\nfirst doc\ta\nsecond, with a comma\tb\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for suffix in ("jsonl", "csv", "tsv", "parquet"):
        assert [r for _, r in read_records(tmp_path / f"d.{suffix}")] == rows, suffix
    (tmp_path / "d.txt").write_text("line one\nline two\n\n\nsecond document\n")
    docs = list(read_records(tmp_path / "d.txt"))
    assert docs == [(1, {"text": "line one\nline two"}), (5, {"text": "second document"})]


def test_missing_field_and_extra_csv_column_name_file_and_line(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n{"body": "y"}\n')
    with pytest.raises(PtmError, match=r"d.jsonl:2: missing field 'text'"):
        list(read_records(tmp_path / "d.jsonl", ("text",)))
    (tmp_path / "d.csv").write_text("text,label\nok,a\nbad,b,extra\n")
    with pytest.raises(PtmError, match=r"d.csv:3: more columns"):
        list(read_records(tmp_path / "d.csv"))


def test_hub_dataset_offline_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PtmError, match="offline") as err:
        resolve_source("hf:stanfordnlp/imdb")
    assert "\n" not in str(err.value)
