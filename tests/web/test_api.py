"""The explorer's JSON API without a browser: status codes and the errors' wording."""
import json
import urllib.error
import urllib.request

import pytest

GEMM_4x4 = dict(kind="gemm", m=256, n=256, k=128, bm=64, bn=64, bk=64, cache_bytes=65536, line_bytes=32, in_flight=1)
CHAIN = dict(kind="chain", m=128, n=256, k=128, bm=64, bn=64, bk=64, cache_bytes=65536, line_bytes=32, in_flight=1)


def post(server, route, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(server + "api/" + route, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text else {}


def test_layout_describes_tiles_and_dependencies(server):
    status, layout = post(server, "layout", {"problem": CHAIN})
    assert status == 200
    assert [(op["grid_m"], op["grid_n"]) for op in layout["ops"]] == [(2, 4), (2, 2)]
    # gemm1(0,0) reads row block 0 of h, written by the four gemm0 tiles of row 0.
    first_gemm1 = layout["ops"][1]["tiles"][0]
    assert layout["tiles"][first_gemm1]["deps"] == layout["ops"][0]["tiles"][:4]
    assert 0 < layout["compulsory_bytes"] <= layout["lower_bound_bytes"]
    assert "chain_rows:1" in layout["orders"] and "search" in layout["orders"]


def test_simulate_is_cumulative_and_refuses_broken_dependencies(server):
    status, sim = post(server, "simulate", {"problem": GEMM_4x4, "order": [0, 1, 5]})
    assert status == 200
    steps = sim["steps"]
    assert [s["tile"] for s in steps] == [0, 1, 5]
    assert steps[-1]["cumulative_bytes"] == sum(s["miss_bytes"] + s["write_bytes"] for s in steps)
    assert not sim["complete"]
    status, err = post(server, "simulate", {"problem": CHAIN, "order": [0, 8]})
    assert status == 409 and "gemm1(0,0) cannot run at step 2" in err["error"], err
    status, err = post(server, "simulate", {"problem": GEMM_4x4, "order": [3, 3]})
    assert status == 409 and "already ran at step 1" in err["error"], err


@pytest.mark.parametrize("route,body,status,expected", [
    ("layout", {"problem": {**GEMM_4x4, "kind": "conv"}}, 400, "kind 'conv' is unknown"),
    ("layout", {"problem": {**GEMM_4x4, "line_bytes": 0}}, 400, "line_bytes = 0 is outside [1, 65536]"),
    ("layout", {"problem": {**GEMM_4x4, "k": 1 << 21}}, 400, "k = 2097152 is outside [1, 1048576]"),
    ("layout", {"problem": {**GEMM_4x4, "bk": 1, "k": 4096}}, 400, "4096 K-steps per tile; the explorer's limit is 1024"),
    ("layout", {"problem": {**CHAIN, "elem_bytes": 4}}, 400, "elem_bytes = 4: the chain and FFN views are bf16"),
    ("layout", {}, 400, "needs a JSON object with a 'problem' object"),
    ("simulate", {"problem": GEMM_4x4, "order": [16]}, 400, "tile id 16 is outside [0, 16)"),
    ("simulate", {"problem": GEMM_4x4, "order": ["a"]}, 400, "order entries must be tile ids"),
    ("order", {"problem": GEMM_4x4, "name": "zigzag"}, 400, "zigzag"),
    ("compare", {"problem": GEMM_4x4, "names": ["row_major"] * 17}, 400, "17 orders to compare; the explorer's limit is 16"),
    ("export", {"problem": GEMM_4x4, "order": [0, 1]}, 400, "the order has 2 of 16 tiles"),
    ("nothing", {"problem": GEMM_4x4}, 404, "no API route 'nothing'"),
])
def test_bad_requests_name_the_bad_value(server, route, body, status, expected):
    got_status, err = post(server, route, body)
    assert got_status == status and expected in err["error"], err


def test_malformed_json_is_a_400(server):
    status, err = post(server, "layout", None, raw=b"{problem:")
    assert status == 400 and err["error"].startswith("malformed JSON request"), err


def test_page_files_are_served(server):
    for path, kind in (("", "text/html"), ("explorer.js", "text/javascript"), ("explorer.css", "text/css")):
        with urllib.request.urlopen(server + path, timeout=10) as res:
            assert res.headers["Content-Type"].startswith(kind)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server + "../CMakeLists.txt", timeout=10)
    assert e.value.code in (400, 404)
