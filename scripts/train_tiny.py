"""Train a tiny Llama for a few steps on the bundled corpus, packed by packtool, on CPU.

    pip install '.[torch]' transformers && python scripts/train_tiny.py [--steps 60]

Tokenizes fixtures/corpus, packs it (seq-len 256, bfd), then trains a randomly initialised
2-layer Llama with AdamW on flattened [1, N] rows from packtool.torch.collate_tensors: position
ids restart per document, no attention mask, no padding. Prints the loss, which must go down.
With Hugging Face's Trainer the same pieces plug in as
``Trainer(model, TrainingArguments(..., remove_unused_columns=False),
train_dataset=TorchPackedDataset(dir), data_collator=collate_tensors)`` (the collate needs
cu_seqlens, which the default column pruning would drop).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
import transformers

import packtool
from packtool.torch import TorchPackedDataset, collate_tensors, model_inputs

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--packs-per-step", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fx = ROOT / "fixtures"
        packtool.tokenize_files([str(fx / "corpus")], fx / "tokenizer", tmp / "corpus",
                                packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
        res = packtool.pack_corpus([tmp / "corpus"], tmp / "packed", args.seq_len, "bfd")
        print(res.summary())
        ds = TorchPackedDataset(tmp / "packed")
        vocab = packtool.open_tokens(tmp / "corpus").meta["vocab_size"]
        cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=args.seq_len)
        model = transformers.LlamaForCausalLM(cfg)
        model.set_attn_implementation("sdpa")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        loader = torch.utils.data.DataLoader(ds, batch_size=args.packs_per_step, shuffle=True,
                                             collate_fn=collate_tensors, drop_last=True)
        step, first, last = 0, None, None
        model.train()
        while step < args.steps:
            for batch in loader:
                loss = model(**model_inputs(batch), use_cache=False).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
                first = loss.item() if first is None else first
                last = loss.item()
                if step % 10 == 0 or step == args.steps - 1:
                    print(f"step {step:4d}  loss {last:.3f}  "
                          f"({batch['input_ids'].shape[1]} tokens, "
                          f"{len(batch['cu_seq_lens_q']) - 1} documents in the row)")
                step += 1
                if step >= args.steps:
                    break
        print(f"loss {first:.3f} -> {last:.3f}: {'down' if last < first else 'NOT down'}")


if __name__ == "__main__":
    main()
