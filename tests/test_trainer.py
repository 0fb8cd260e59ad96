"""The Hugging Face ``Trainer`` recipe of docs/training/many-ranks.md, run as written:
PackBatchSampler in an overridden ``get_train_dataloader``, ``collate_tensors``, a tiny Llama
built from a config, and ``trainer.train(resume_from_checkpoint=...)`` after an interruption.

Trainer resumes data by re-iterating the loader's batch sampler and dropping the epoch's finished
batches (accelerate's ``skip_first_batches``: index lists only, no pack is read), after calling
our sampler's ``set_epoch`` through the wrapper. Checked: the resumed run trains exactly the
batches the uninterrupted run trained after the checkpoint, across an epoch boundary.
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BATCH = 4  # packs per step: the first 80 documents make 49 packs -> 12 steps per epoch


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory):
    import packtool

    d = tmp_path_factory.mktemp("trainer")
    fx = ROOT / "fixtures"
    lines = (fx / "corpus" / "part-0.jsonl").read_text().splitlines(keepends=True)
    (d / "docs.jsonl").write_text("".join(lines[:80]))
    packtool.tokenize_files([str(d / "docs.jsonl")], fx / "tokenizer", d / "c",
                            packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
    packtool.pack_corpus([d / "c"], d / "p", 256, "bfd")
    return d / "p"


def run(packed_dir, out, seen, max_steps, resume=None):
    """One Trainer run of the docs' recipe; ``seen`` gets each batch's pack indices."""
    import torch
    import transformers
    from transformers import Trainer, TrainingArguments

    import packtool
    from packtool.torch import PackBatchSampler, TorchPackedDataset, collate_tensors

    class Indexed(TorchPackedDataset):  # the docs' dataset, plus which pack each item is
        def __getitem__(self, i):
            return {**super().__getitem__(i), "pack": i}

    def collate(examples):
        seen.append([int(e.pop("pack")) for e in examples])
        return collate_tensors(examples)

    class PackedTrainer(Trainer):  # docs/training/many-ranks.md, "Hugging Face Trainer"
        def get_train_dataloader(self):
            a = self.args
            sampler = PackBatchSampler(self.train_dataset.packed, rank=a.process_index,
                                       world_size=a.world_size, batch_size=BATCH, seed=a.seed,
                                       balance="attention")
            loader = torch.utils.data.DataLoader(self.train_dataset, batch_sampler=sampler,
                                                 collate_fn=collate,
                                                 num_workers=a.dataloader_num_workers)
            loader.set_epoch = sampler.set_epoch
            return loader

    torch.manual_seed(0)
    vocab = packtool.open_tokens(packed_dir.parent / "c").meta["vocab_size"]
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg)
    model.set_attn_implementation("sdpa")
    args = TrainingArguments(str(out), remove_unused_columns=False, max_steps=max_steps,
                             save_steps=14, save_strategy="steps", logging_steps=10,
                             learning_rate=1e-3, report_to="none", use_cpu=True, seed=3,
                             dataloader_num_workers=0, disable_tqdm=True, save_only_model=False)
    trainer = PackedTrainer(model=model, args=args, train_dataset=Indexed(packed_dir))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.mark.slow
def test_trainer_recipe_resumes_exactly(packed_dir, tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    from packtool.torch import PackBatchSampler

    full = []
    trainer = run(packed_dir, tmp_path / "run", full, max_steps=16)
    assert trainer.state.global_step == 16 and len(full) == 16
    # epoch 0 then epoch 1 of the sampler, as Trainer called set_epoch
    epochs = []
    for e in (0, 1):
        s = PackBatchSampler(trainer.train_dataset.packed, rank=0, world_size=1,
                             batch_size=BATCH, seed=3, balance="attention")
        s.set_epoch(e)
        epochs += list(s.steps())
    assert len(epochs) == 24  # 12 steps an epoch: the runs cross into epoch 1
    assert full == epochs[:16]
    resumed = []
    run(packed_dir, tmp_path / "run", resumed, max_steps=16,
        resume=str(tmp_path / "run" / "checkpoint-14"))
    assert resumed == full[14:]  # epoch 1, steps 2..3: nothing repeated, nothing skipped
