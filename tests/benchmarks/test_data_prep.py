"""The data benchmark's target table (issue 13), judged on made-up rows: no timing here."""
from benchmarks.data_prep import targets


def row(candidate, mb, tokens_per_s, peak, first=2.0):
    return {"candidate": candidate, "corpus_mb": mb, "tokens_per_s": tokens_per_s, "peak_rss_mb": peak,
            "first_batch_s": first}


def test_targets_judge_memory_growth_throughput_against_the_better_peer_and_first_batch():
    rows = [row("ptm_app", 100, 260_000, 1000), row("datasets map+group_texts", 100, 250_000, 1600),
            row("litdata optimize", 100, 240_000, 1000),
            row("ptm_app", 1000, 255_000, 1250, first=3.0), row("datasets map+group_texts", 1000, 270_000, 2000)]
    lines = targets(rows).strip().splitlines()
    assert lines[0].startswith("| target (issue 13)")
    met = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[-1] for line in lines[2:]}
    assert met == {"peak RSS at 1,000 MB within 1.2x of 100 MB": "**no**",  # 1.25x
                   "peak RSS at 1,000 MB under 1,500 MB": "yes",
                   "tokens/s at 100 MB >= the better peer (HF datasets `map(num_proc)` + `group_texts`)": "yes",
                   "tokens/s at 1,000 MB >= the better peer (HF datasets `map(num_proc)` + `group_texts`)": "**no**",
                   "first batch at 1,000 MB under 10 s": "yes"}
    assert "1.25x" in lines[2] and "0.94x" in lines[5]


def test_no_targets_without_two_sizes():
    assert targets([row("ptm_app", 100, 1, 1)]) == ""
