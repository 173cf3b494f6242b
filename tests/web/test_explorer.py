"""The explorer in a real headless Chromium against the real server: every number the page shows
must be the C++ model's, so the traffic it shows is checked against `tileweave sim --json`."""
import json
import subprocess
import time

import pytest

# A 4x4 output grid: 256x256x128 with 64^3 tiles (2 K-steps per tile) and a cache of 8 blocks of
# 8 KiB, so the order matters (one tile reads 4 blocks) but not everything is a miss.
GEMM_4x4 = dict(kind="gemm", m=256, n=256, k=128, bm=64, bn=64, bk=64, elem_bytes=2,
                cache_bytes=65536, line_bytes=32, in_flight=1)
# A path through all 16 tiles: down column 0, up column 1, ... (a column snake), but with the last
# two columns swapped so that it is not a named order.
PATH = [(r, 0) for r in range(4)] + [(r, 1) for r in reversed(range(4))] + \
       [(r, 3) for r in range(4)] + [(r, 2) for r in reversed(range(4))]
CLI_4x4 = ["--gemm", "256x256x128", "--tile", "64x64x64", "--cache", "65536", "--line", "32", "--p", "1"]


def cli_sim(tileweave_bin, *args, problem=CLI_4x4):
    out = subprocess.run([str(tileweave_bin), "sim", *problem, *args, "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def total_bytes(report):
    """DRAM bytes (read + write) of one order in `tileweave sim --json`'s answer."""
    r = report["orders"][0] if "orders" in report else report
    return r["dram_read"] + r["dram_write"]


def wait_for_file(path, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        if path.exists() and path.stat().st_size > 0:
            return path
        time.sleep(0.1)
    raise AssertionError(f"{path} was not downloaded")


def test_page_loads_with_default_problem(page):
    assert page.d.title == "tileweave explorer"
    assert page.text("#error") == ""
    assert page.steps() == 0
    assert len(page.d.find_elements("css selector", "rect.tile")) == int(page.text("#tile-count")) > 0
    # The chart shows the default orders and the compulsory line.
    assert len(page.d.find_elements("css selector", "#chart polyline.series")) >= 2


def test_click_path_undo_redo_matches_cli(page, tileweave_bin, downloads):
    page.set_problem(**GEMM_4x4)
    assert page.text("#error") == ""
    assert page.text("#tile-count") == "16"
    traffic = []
    for tm, tn in PATH:
        page.click_tile(0, tm, tn)
        traffic.append(page.traffic())
    assert page.steps() == 16
    assert traffic == sorted(traffic) and traffic[0] > 0  # cumulative
    page.screenshot("gemm-4x4-path")

    page.press("undo")
    page.press("undo")
    assert page.steps() == 14
    assert page.traffic() == traffic[13]
    assert "done" not in page.tile(0, *PATH[15]).get_attribute("class")
    page.press("redo")
    page.press("redo")
    assert page.steps() == 16
    assert page.traffic() == traffic[15]

    # The exported order is what `tileweave sim --order-file` reads, and it costs the same there.
    exported = downloads / "tileweave-order.json"
    exported.unlink(missing_ok=True)
    page.press("export-json")
    wait_for_file(exported)
    order = json.loads(exported.read_text())
    assert len(order["order"]) == 16
    assert total_bytes(cli_sim(tileweave_bin, "--order-file", str(exported))) == page.traffic()


def test_named_order_step_and_play(page, tileweave_bin):
    page.set_problem(**GEMM_4x4)
    page.select_order("hilbert")
    page.press("load-order")
    assert "hilbert" in page.text("#order-label")
    page.press("step")
    assert page.steps() == 1
    page.el("#play").click()
    page.wait(lambda d: page.steps() == 16, timeout=30)
    assert page.traffic() == total_bytes(cli_sim(tileweave_bin, "--order", "hilbert"))
    # The path is drawn: one arrow between consecutive tiles, a step number on every tile.
    assert len(page.d.find_elements("css selector", "#grid .arrow")) == 15
    assert sorted(int(t.text) for t in page.d.find_elements("css selector", "#grid text.stepno")) == list(range(1, 17))
    page.screenshot("gemm-4x4-hilbert")


@pytest.mark.parametrize("in_flight", [2, 4])
def test_tiles_in_flight_match_cli(page, tileweave_bin, in_flight):
    page.set_problem(**{**GEMM_4x4, "in_flight": in_flight})
    page.select_order("morton")
    page.press("load-order")
    page.press("to-end")
    cli = [*CLI_4x4[:-1], str(in_flight)]
    assert page.traffic() == total_bytes(cli_sim(tileweave_bin, "--order", "morton", problem=cli))
    assert page.text("#traffic-note").startswith("incl.")  # no "simulate() says otherwise" note


def test_chain_order_export_matches_cli(page, tileweave_bin, downloads):
    page.set_problem(kind="chain", m=256, n=256, k=128, bm=64, bn=64, bk=64, cache_bytes=98304, in_flight=1)
    page.select_order("chain_rows:1")
    page.press("load-order")
    page.press("to-end")
    exported = downloads / "tileweave-order.json"
    exported.unlink(missing_ok=True)
    page.press("export-json")
    wait_for_file(exported)
    cli = page.text("#message").split("Check it with: ")[1].split()
    assert cli[:2] == ["tileweave", "sim"] and cli[-2] == "--order-file", cli
    problem = cli[2:-2]
    assert total_bytes(cli_sim(tileweave_bin, "--order-file", str(exported), problem=problem)) == page.traffic()
    assert total_bytes(cli_sim(tileweave_bin, "--order", "chain_rows:1", problem=problem)) == page.traffic()


def test_search_result_is_no_worse_than_named_orders(page, tileweave_bin):
    page.set_problem(**GEMM_4x4)
    page.select_order("search")
    page.press("load-order")
    assert "search" in page.text("#message")
    page.press("to-end")
    assert page.steps() == 16
    for name in ("row_major", "snake", "hilbert"):
        assert page.traffic() <= total_bytes(cli_sim(tileweave_bin, "--order", name))


def test_export_svg_and_png(page, downloads):
    page.set_problem(**GEMM_4x4)
    page.select_order("snake")
    page.press("load-order")
    page.press("to-end")
    for name, check in (("tileweave-order.svg", lambda b: b.lstrip().startswith(b"<svg") and b'class="arrow"' in b),
                        ("tileweave-order.png", lambda b: b.startswith(b"\x89PNG"))):
        path = downloads / name
        path.unlink(missing_ok=True)
        page.el("#export-" + name.rsplit(".", 1)[1]).click()
        assert check(wait_for_file(path).read_bytes()), name


def test_chain_view_refuses_a_click_that_breaks_a_dependency(page):
    # GEMM0 h[128, 256] = x[128, 128] W0^T (2x4 tiles), GEMM1 y[128, 128] = h W1^T (2x2 tiles).
    page.set_problem(kind="chain", m=128, n=256, k=128, bm=64, bn=64, bk=64, cache_bytes=65536)
    assert page.text("#error") == ""
    assert len(page.d.find_elements("css selector", 'rect.tile[data-op="1"]')) == 4
    page.click_tile(1, 0, 0)  # needs the whole first row of GEMM0
    assert page.steps() == 0
    message = page.text("#message")
    assert "Refused" in message and "gemm1(0,0)" in message and "gemm0(0," in message, message
    assert "refused" in page.el("#message").get_attribute("class")
    page.screenshot("chain-refused")
    for tn in range(4):
        page.click_tile(0, 0, tn)
    page.click_tile(1, 0, 0)  # now its producers have run
    assert page.steps() == 5
    assert "Refused" not in page.text("#message")
    page.screenshot("chain-accepted")


@pytest.mark.parametrize("field,value,expected", [
    ("m", "0", "m = 0 is outside [1, "),
    ("bm", "512", "bm = 512 is outside [1, 256] (a tile must fit in M)"),
    ("cache_bytes", "16", "cache_bytes = 16 is outside [32, "),
    ("m", "12.5", "m must be an integer, got 12.5"),
    ("cache_bytes", "lots", "cache_bytes must be an integer, got 'lots'"),
])
def test_bad_input_shows_its_error(page, field, value, expected):
    page.set_problem(**{**GEMM_4x4, field: value})
    assert expected in page.text("#error")
    page.screenshot(f"bad-input-{field}-{value}")


def test_too_large_problem_names_the_limit(page):
    page.set_problem(**{**GEMM_4x4, "m": 8192, "n": 8192})
    assert "16384 tiles; the explorer's limit is 4096" in page.text("#error")
