#!/usr/bin/env python3
"""tiny_model.py — builds a tiny random llama (Hugging Face folder + the same weights as a GGUF kvsim reads) for the measure-model check.

Usage: tiny_model.py OUT_DIR [--seed S] [--steps N] (a few training steps on GPL-3). Writes OUT_DIR/hf/ (config, safetensors, tokenizer.json:
a byte-level BPE trained on GPL-3) and OUT_DIR/tiny.gguf in the layout core/refmodel/gguf.c,
model.c and tokenizer.c read (llama architecture, F32 tensors, Q and K rows permuted to
llama.cpp's interleaved RoPE order, tokenizer.ggml.model gpt2 with pre-tokenizer gpt2).
Nothing is written outside OUT_DIR.
"""
import argparse
import os
import sys

TEXT = "/usr/share/common-licenses/GPL-3"
ROPE_THETA = 10000.0


def permute(w, n_head):
    """HF's rotate-half Q/K rows -> llama.cpp's adjacent pairs (convert_hf_to_gguf's permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main(argv):
    ap = argparse.ArgumentParser(prog="tiny_model.py")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steps", type=int, default=150, help="training steps on the text (0: random weights)")
    a = ap.parse_args(argv)
    import gguf
    import numpy as np
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(os.path.join(a.out, "hf"), exist_ok=True)
    # Byte-level BPE: every byte is a token, then merges learnt from the text.
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=640, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tk.train([TEXT], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(os.path.join(a.out, "hf"))
    vocab = tk.get_vocab()
    n_vocab = len(vocab)
    tokens = [None] * n_vocab
    for t, i in vocab.items():
        tokens[i] = t
    import json
    merges = json.loads(tk.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]

    torch.manual_seed(a.seed)
    cfg = LlamaConfig(vocab_size=n_vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, rope_theta=ROPE_THETA, tie_word_embeddings=True,
                      bos_token_id=0, eos_token_id=0)
    model = LlamaForCausalLM(cfg)
    # A few steps of training on the text: attention that depends on the context, so that
    # coarser KV changes some greedy tokens (a random model repeats one token whatever its KV).
    with open(TEXT, encoding="utf-8") as f:
        ids = torch.tensor(tk.encode(f.read()).ids)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(a.seed)
    model.train()
    for step in range(a.steps):
        starts = torch.randint(0, len(ids) - 129, (8,), generator=gen)
        batch = torch.stack([ids[s:s + 128] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    print(f"tiny_model: {a.steps} training steps, last loss {loss.item() if a.steps else float('nan'):.2f}")
    model.save_pretrained(os.path.join(a.out, "hf"))

    w = gguf.GGUFWriter(os.path.join(a.out, "tiny.gguf"), "llama")
    w.add_name("kvsim tiny random llama (measure-model check)")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    H, KVH = cfg.num_attention_heads, cfg.num_key_value_heads
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        w.add_tensor(f"blk.{l}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{l}.attn_q.weight", np.ascontiguousarray(permute(sd[p + "self_attn.q_proj.weight"], H)))
        w.add_tensor(f"blk.{l}.attn_k.weight", np.ascontiguousarray(permute(sd[p + "self_attn.k_proj.weight"], KVH)))
        w.add_tensor(f"blk.{l}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{l}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{l}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{l}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{l}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{l}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"tiny_model: {a.out}/hf and {a.out}/tiny.gguf ({n_vocab} tokens, {len(merges)} merges)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
