"""Seeded workload generators, token ids and JSONL traces."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jenga.sim.traces import TraceFormatError, dump_jsonl, load_jsonl
from jenga.sim.workloads import (
    FIRST_TOKEN_ID,
    WORKLOAD_NAMES,
    InvalidRequestError,
    SimRequest,
    UnknownWorkloadError,
    Workload,
    get_workload,
)

EXPECTED_NAMES = {"mmlu-pro", "arxiv-qa", "mmmu-pro", "arxiv-multiq", "ministral-static", "ministral-dynamic",
                  "decode-batch-20", "spec-decode", "mmlu-pro-5shot"}


def prompts(w):
    return np.array([r.prompt_len for r in w])


def outputs(w):
    return np.array([r.output_len for r in w])


def test_names_and_unknown():
    assert set(WORKLOAD_NAMES) == EXPECTED_NAMES
    with pytest.raises(UnknownWorkloadError) as e:
        get_workload("sharegpt")
    assert "sharegpt" in str(e.value) and "mmlu-pro" in str(e.value)
    assert isinstance(e.value, KeyError)
    with pytest.raises(TypeError, match="num_requests"):
        get_workload("mmlu-pro", num_reqs=3)


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_deterministic_valid_and_sorted(name):
    a = get_workload(name, seed=7, rate=3.0)
    b = get_workload(name, seed=7, rate=3.0)
    c = get_workload(name, seed=8, rate=3.0)
    assert isinstance(a, Workload) and isinstance(a, list) and len(a) > 0
    assert a == b and a != c
    assert a.info == b.info and a.info.seed == 7
    arr = [r.arrival_s for r in a]
    assert arr == sorted(arr) and arr[0] == 0.0
    assert len({r.request_id for r in a}) == len(a)
    for r in a:
        assert r.prompt_len + r.output_len <= a.info.max_len
    np.testing.assert_array_equal(a[0].prompt_token_ids(seed=7), b[0].prompt_token_ids(seed=7))


def test_rate_changes_arrivals_not_lengths():
    burst = get_workload("arxiv-qa", num_requests=50, seed=3)
    poisson = get_workload("arxiv-qa", num_requests=50, seed=3, rate=2.0)
    assert all(r.arrival_s == 0 for r in burst)
    np.testing.assert_array_equal(prompts(burst), prompts(poisson))
    gaps = np.diff([r.arrival_s for r in get_workload("mmlu-pro", num_requests=20000, rate=4.0, seed=1)])
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    with pytest.raises(ValueError, match="rate"):
        get_workload("mmlu-pro", rate=0)


def test_mmlu_pro_statistics():
    w = get_workload("mmlu-pro", num_requests=20000, seed=0)
    p = prompts(w)
    assert p.mean() == pytest.approx(300, rel=0.03)
    assert p.max() <= 3076 and p.min() >= 16
    assert set(outputs(w)) == {20}
    assert len(get_workload("mmlu-pro")) == 1000
    assert prompts(get_workload("mmlu-pro", num_requests=2000, max_len=256, output_len=20)).max() <= 236


def test_arxiv_qa_statistics_and_clipping():
    w = get_workload("arxiv-qa", num_requests=20000, seed=0)
    p = prompts(w)
    assert p.mean() == pytest.approx(92_408, rel=0.02)
    assert p.max() == 131072 - 150 and p.min() >= 1024
    assert 0.25 < np.mean(p == p.max()) < 0.33
    assert set(outputs(w)) == {150}
    big = prompts(get_workload("arxiv-qa", num_requests=20000, seed=0, max_len=1 << 20))
    assert big.mean() > p.mean() * 1.15
    small = prompts(get_workload("arxiv-qa", num_requests=100, max_len=32768))
    assert small.max() <= 32768 - 150
    with pytest.raises(ValueError, match="max_len"):
        get_workload("arxiv-qa", max_len=100)


def test_mmmu_pro_statistics():
    w = get_workload("mmmu-pro", num_requests=20000, seed=0)
    img = np.array([r.images[0][1] for r in w])
    text = prompts(w) - img
    assert img.mean() == pytest.approx(6193, rel=0.01)
    assert text.mean() == pytest.approx(43, rel=0.03)
    assert set(np.unique(img)) <= {1601, 3202, 4803, 6404}
    assert all(len(r.images) == 1 and r.images[0][0] == 1 for r in w)
    assert len({r.images[0][2] for r in w}) == len(w)
    assert set(outputs(w)) == {200}
    with pytest.raises(ValueError, match="max_len"):
        get_workload("mmmu-pro", max_len=4096)


def test_arxiv_multiq_structure():
    w = get_workload("arxiv-multiq", num_articles=3, questions_per_article=5, seed=2)
    assert len(w) == 15
    assert [r.prefix_id for r in w[:6]] == ["article-0", "article-1", "article-2"] * 2
    groups = {}
    for r in w:
        groups.setdefault(r.prefix_id, set()).add(r.prefix_len)
        assert 20 <= r.prompt_len - r.prefix_len and r.prompt_len + r.output_len <= 131072
    assert all(len(v) == 1 for v in groups.values()) and len(groups) == 3
    grouped = get_workload("arxiv-multiq", num_articles=3, questions_per_article=5, seed=2, order="grouped")
    assert [r.prefix_id for r in grouped[:5]] == ["article-0"] * 5
    shuffled = get_workload("arxiv-multiq", num_articles=3, questions_per_article=5, seed=2, order="shuffled")
    assert sorted(r.prefix_id for r in shuffled) == sorted(r.prefix_id for r in w)
    assert len(get_workload("arxiv-multiq", num_articles=4, num_requests=10)) == 10
    with pytest.raises(ValueError, match="order"):
        get_workload("arxiv-multiq", order="random")


def test_ministral_static_and_dynamic():
    s = prompts(get_workload("ministral-static", num_requests=20000, seed=0))
    d = prompts(get_workload("ministral-dynamic", num_requests=20000, seed=0))
    assert s.mean() == pytest.approx(65536, rel=0.02) and d.mean() == pytest.approx(65536, rel=0.02)
    assert s.min() >= 16384 and s.max() <= 114688
    q = len(s) // 4
    assert s[:q].mean() == pytest.approx(s[-q:].mean(), rel=0.05)  # static over time
    assert d[-q:].mean() > 3 * d[:q].mean()  # dynamic: mean sweeps upward
    assert d.max() <= 131072 - 150


def test_decode_batch_20():
    w = get_workload("decode-batch-20", seed=0)
    assert len(w) == 20 and all(r.arrival_s == 0 for r in w)
    big = get_workload("decode-batch-20", num_requests=20000, seed=0)
    p, o = prompts(big), outputs(big)
    assert p.min() >= 55_000 and p.max() <= 110_000 and o.min() >= 50 and o.max() <= 100
    assert p.mean() == pytest.approx(82_500, rel=0.01) and o.mean() == pytest.approx(75, rel=0.01)


def test_spec_decode_info():
    w = get_workload("spec-decode", seed=4, num_requests=50)
    assert (w.info.name, w.info.num_spec_tokens, w.info.acceptance) == ("spec-decode", 3, 0.7)
    assert w == get_workload("mmlu-pro", seed=4, num_requests=50)
    a = get_workload("spec-decode", base="arxiv-qa", num_requests=5, acceptance=0.5, output_len=64)
    assert a.info.acceptance == 0.5 and set(outputs(a)) == {64} and prompts(a).mean() > 10_000
    assert get_workload("mmlu-pro").info.num_spec_tokens == 0
    with pytest.raises(ValueError, match="acceptance"):
        get_workload("spec-decode", acceptance=1.5)


# ------------------------------------------------------------------------------------ token ids

def test_prompt_token_ids_prefix_and_images():
    a = SimRequest("a", 0.0, 100, 5, "doc", 60, ((70, 10, "img1"),))
    b = SimRequest("b", 0.0, 120, 5, "doc", 60, ((90, 10, "img1"),))
    c = SimRequest("c", 0.0, 100, 5)
    ta, tb, tc = (r.prompt_token_ids(vocab_size=50_000, seed=1) for r in (a, b, c))
    assert ta.dtype == np.int64 and ta.shape == (100,)
    np.testing.assert_array_equal(ta[:60], tb[:60])
    np.testing.assert_array_equal(ta[70:80], tb[90:100])
    assert not np.array_equal(ta[60:70], tb[60:70]) and not np.array_equal(ta, tc)
    assert ta.min() >= FIRST_TOKEN_ID and ta.max() < 50_000
    assert not np.array_equal(ta, a.prompt_token_ids(vocab_size=50_000, seed=2))
    with pytest.raises(InvalidRequestError):
        a.prompt_token_ids(vocab_size=FIRST_TOKEN_ID)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 2000), st.integers(0, 2000), st.integers(0, 2**32))
def test_prompt_token_ids_shared_prefix_property(plen, prefix, seed):
    prefix = min(prefix, plen)
    r1 = SimRequest("x", 0.0, plen, 1, "p" if prefix else None, prefix)
    r2 = SimRequest("y", 1.0, plen + 7, 1, "p" if prefix else None, prefix)
    t1, t2 = r1.prompt_token_ids(seed=seed), r2.prompt_token_ids(seed=seed)
    np.testing.assert_array_equal(t1[:prefix], t2[:prefix])
    np.testing.assert_array_equal(t1, r1.prompt_token_ids(seed=seed))


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt_len=0), "prompt_len"),
    (dict(output_len=0), "output_len"),
    (dict(prompt_len=3.0), "integer"),
    (dict(arrival_s=-1.0), "arrival_s"),
    (dict(arrival_s=math.nan), "arrival_s"),
    (dict(prefix_len=11), "prefix_len"),
    (dict(prefix_len=3), "prefix_id"),
    (dict(images=((8, 5, "h"),)), "image"),
    (dict(images=((0, 5, "h"), (3, 2, "g"))), "image"),
    (dict(images=((0, 5, ""),)), "image"),
    (dict(images=((0, 5),)), "image"),
])
def test_sim_request_validation(kwargs, match):
    base = dict(request_id="r", arrival_s=0.0, prompt_len=10, output_len=1)
    with pytest.raises(InvalidRequestError, match=match):
        SimRequest(**{**base, **kwargs})


# ---------------------------------------------------------------------------------------- JSONL

def test_jsonl_round_trip(tmp_path):
    for name in ("arxiv-multiq", "mmmu-pro", "decode-batch-20"):
        w = get_workload(name, seed=5, rate=1.5)
        path = tmp_path / f"{name}.jsonl"
        dump_jsonl(w, path)
        back = load_jsonl(path)
        assert back == w and back.info.name == f"jsonl:{name}.jsonl"


def test_jsonl_defaults_comments_and_sorting(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("# header\n\n"
                    '{"arrival": 2.5, "prompt_len": 10, "output_len": 3}\n'
                    '{"arrival_s": 1, "prompt_len": 12, "output_len": 4, "prefix_id": 7, "prefix_len": 5,'
                    ' "images": [[6, 4, "abc"]]}\n')
    w = load_jsonl(path)
    assert [r.request_id for r in w] == ["req-1", "req-0"]
    assert w[0] == SimRequest("req-1", 1.0, 12, 4, "7", 5, ((6, 4, "abc"),))


@pytest.mark.parametrize("line, match", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"prompt_len": 3, "output_len": 1}', "missing keys \\['arrival'\\]"),
    ('{"arrival": 0, "output_len": 1}', "prompt_len"),
    ('{"arrival": 0, "prompt_len": 3, "output_len": 1, "colour": 1}', "unknown keys \\['colour'\\]"),
    ('{"arrival": "soon", "prompt_len": 3, "output_len": 1}', "arrival must be a number"),
    ('{"arrival": 0, "prompt_len": 0, "output_len": 1}', "prompt_len"),
    ('{"arrival": 0, "prompt_len": 3, "output_len": 1, "prefix_len": 2}', "prefix_id"),
    ('{"arrival": 0, "prompt_len": 3, "output_len": 1, "images": [[0, 9, "h"]]}', "image"),
    ('{"arrival": 0, "prompt_len": 3, "output_len": 1, "images": [[0, 1]]}', "images must be"),
])
def test_jsonl_errors_name_the_line(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"arrival": 0, "prompt_len": 3, "output_len": 1})
    path.write_text(good + "\n# comment\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=match) as e:
        load_jsonl(path)
    assert str(e.value).startswith(f"{path}:3:")


def test_jsonl_duplicate_ids_and_missing_file(tmp_path):
    path = tmp_path / "dup.jsonl"
    row = json.dumps({"request_id": "a", "arrival": 0, "prompt_len": 3, "output_len": 1})
    path.write_text(row + "\n" + row + "\n")
    with pytest.raises(TraceFormatError, match=r"dup.jsonl:2: duplicate request_id 'a' \(first on line 1\)"):
        load_jsonl(path)
    with pytest.raises(FileNotFoundError):
        load_jsonl(tmp_path / "missing.jsonl")
