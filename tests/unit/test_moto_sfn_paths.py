"""The local moto server's Step Functions interpreter parses each JSONPath once
(infra/local/moto_sfn_paths.py): the expression jsonpath_ng parses, kept per path, in every module
of moto's parser that imported ``parse`` by name."""

import jsonpath_ng
import jsonpath_ng.ext
from moto.stepfunctions.parser.asl.component.common.path import result_path
from moto.stepfunctions.parser.asl.utils import json_path

from infra.local import moto_sfn_paths


def test_each_path_is_parsed_once_and_finds_what_a_fresh_parse_finds(monkeypatch):
    parsed: list[str] = []

    def counting(parse):
        def count(path):
            parsed.append(path)
            return parse(path)

        return count

    originals = {jsonpath_ng.parse: "plain", jsonpath_ng.ext.parse: "ext"}
    plain, ext = counting(jsonpath_ng.parse), counting(jsonpath_ng.ext.parse)
    monkeypatch.setattr(jsonpath_ng, "parse", plain)
    monkeypatch.setattr(jsonpath_ng.ext, "parse", ext)
    for module in (result_path, json_path):  # each imported one of them by name
        imported = getattr(module.parse, "__wrapped__", module.parse)  # kept already, if installed
        monkeypatch.setattr(module, "parse", plain if originals[imported] == "plain" else ext)
    monkeypatch.setattr(moto_sfn_paths, "_installed", False)
    moto_sfn_paths.install()

    assert result_path.parse is not plain and result_path.parse is not ext
    assert json_path.parse is not plain and json_path.parse is not ext
    keep = json_path.parse
    first = keep("$.batch.counts")
    assert keep("$.batch.counts") is first
    data = {"batch": {"counts": {"completed": 3}}}
    assert [m.value for m in first.find(data)] == [{"completed": 3}]
    assert [m.value for m in first.find({"batch": {"counts": 7}})] == [7]  # no state kept between finds
    other = keep("$.batch")
    assert other is not first and [m.value for m in other.find(data)] == [data["batch"]]
    assert parsed.count("$.batch.counts") == 1 and parsed.count("$.batch") == 1
