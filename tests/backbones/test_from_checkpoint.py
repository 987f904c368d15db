"""A run used as a backbone (stage chaining, teachers, pruning sources) is exported once into the cache; that first
export rebuilds the model (a random init, then the run's weights) and must leave the RNG untouched, or the first
run started from it draws differently from every later one."""
import torch

from ptm_app.backbones.build import model_dir
from tests.conftest import run_main, tiny_mlm_config


def test_the_first_export_of_a_run_leaves_the_rng_as_a_cached_one_does(tiny_corpus, tmp_path):
    runs = tmp_path / "runs"
    cfg = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2)
    assert run_main(["fit", "--config", str(cfg), "--run_name", "src"], runs) == 0
    ckpt = runs / "src" / "checkpoints" / "last.ckpt"
    torch.manual_seed(3)
    first = model_dir(str(ckpt))  # not cached yet: rebuilt and written
    after_first = torch.rand(4)
    torch.manual_seed(3)
    again = model_dir(str(ckpt))  # cached
    after_cached = torch.rand(4)
    assert first == again
    assert torch.equal(after_first, after_cached)
