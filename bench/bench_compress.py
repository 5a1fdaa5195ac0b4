#!/usr/bin/env python3
"""Pruning and distillation on Fashion-MNIST, end to end, with the fathom binary
(the figures of docs/DEPLOY.md):

  prune    fashion-cnn trained for --teacher-steps, then `fathom prune --structured
           channels --sparsity 0.5` with and without --finetune-steps: test accuracy
           of each, and bench_prune's forward times (eager and compiled, batch 1 and
           32) of the pruned model against the original
  distill  a student of half the teacher's width (conv 16/32, linear 64) trained
           --student-steps with `fathom distill` and alone with `fathom train`, the
           same steps and seed, for each seed: mean and spread of the test accuracy
           and loss

  distill-gpt  kjv-gpt trained --gpt-teacher-steps as the teacher, and a student of half
           its width (n_embd 64, ffn_hidden 256, the same 4 layers and BPE tokenizer)
           trained --gpt-student-steps with `fathom distill` and alone with `fathom
           train`, the same steps and seed, for each seed: the final validation loss

  prune-gpt  the kjv-gpt teacher of distill-gpt pruned by heads and by MLP neurons at
           --gpt-sparsity, each fine-tuned --gpt-finetune-steps, beside the unpruned model
           fine-tuned the same steps (sparsity 0: the control): validation loss after
           fine-tuning, parameters, and decode tokens/s of `fathom generate` (KV cache,
           --gpt-tokens tokens, median of --rounds interleaved runs)

Usage: python3 bench/bench_compress.py BUILD_DIR [--work DIR] [--teacher-steps 2000]
         [--finetune-steps 300] [--student-steps 1000] [--seeds 1 2 3] [--rounds 15]
         [--threads 2] [--only prune|distill|distill-gpt] [--temperature 2] [--alpha 0.5]
         [--skip-alone] [--gpt-teacher-steps 1000] [--gpt-student-steps 500]
One JSON line per result on stdout; the commands run are echoed on stderr.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def sh(cmd, env=None):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, env=env, text=True).stdout
    return out


def last_json(out):
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])


def student_recipe(fathom_src, path):
    """fashion-cnn at half width: conv 32 -> 16, conv 64 -> 32, linear 128 -> 64."""
    text = open(os.path.join(fathom_src, "data", "recipes", "fashion-cnn.ini")).read()
    text = text.replace("layer = conv2d 32 3", "layer = conv2d 16 3").replace("layer = conv2d 64 3", "layer = conv2d 32 3")
    text = text.replace("layer = linear 128", "layer = linear 64")
    assert text.count("conv2d 16") == 1 and text.count("conv2d 32") == 1 and "linear 64" in text
    open(path, "w").write(text)


def gpt_student_recipe(fathom_src, path):
    """kjv-gpt at half width: n_embd 128 -> 64, ffn_hidden 512 -> 256 (4 heads of 16)."""
    text = open(os.path.join(fathom_src, "data", "recipes", "kjv-gpt.ini")).read()
    text = text.replace("n_embd = 128", "n_embd = 64").replace("ffn_hidden = 512", "ffn_hidden = 256")
    text = text.replace("name = kjv-gpt", "name = kjv-gpt-half")
    assert "n_embd = 64" in text and "ffn_hidden = 256" in text
    open(path, "w").write(text)


def kjv_teacher(a, fathom, env):
    """kjv-gpt trained --gpt-teacher-steps in --work (an existing one is reused)."""
    teacher = os.path.join(a.work, "kjv-teacher")
    if not os.path.exists(os.path.join(teacher, "model.safetensors")):
        sh([fathom, "train", "kjv-gpt", "--steps", str(a.gpt_teacher_steps), "--out", teacher, "--quiet", "--json"], env)
    return teacher


def distill_gpt(a, fathom, src, env):
    teacher = kjv_teacher(a, fathom, env)
    ini = os.path.join(a.work, "kjv-gpt-half.ini")
    gpt_student_recipe(src, ini)
    res = {"distilled": [], "alone": []}
    for s in a.seeds:
        for kind in ("distilled",) if a.skip_alone else ("distilled", "alone"):
            tag = f"-T{a.temperature:g}-a{a.alpha:g}" if kind == "distilled" else ""
            out_dir = os.path.join(a.work, f"gpt-student-{kind}{tag}-{s}")
            subprocess.run(["rm", "-rf", out_dir], check=True)
            cmd = ([fathom, "distill", "--teacher", teacher, "--student", ini, "--temperature", str(a.temperature),
                    "--alpha", str(a.alpha)] if kind == "distilled" else [fathom, "train", ini])
            j = last_json(sh(cmd + ["--steps", str(a.gpt_student_steps), "--seed", str(s), "--out", out_dir, "--json",
                                    "--quiet"], env))
            # the lone student builds its BPE tokenizer from the same corpus and keys: the same
            # file as the teacher's, so both validation losses are over the same tokens
            same = open(os.path.join(out_dir, "tokenizer.txt"), "rb").read() == \
                open(os.path.join(teacher, "tokenizer.txt"), "rb").read()
            res[kind].append(j["val_loss"])
            print(json.dumps({"row": "gpt student", "kind": kind, "seed": s, "steps": a.gpt_student_steps,
                              "temperature": a.temperature if kind == "distilled" else None,
                              "alpha": a.alpha if kind == "distilled" else None, "val_loss": j["val_loss"],
                              "teacher_tokenizer": same}), flush=True)
    for kind, v in res.items():
        if v:
            print(json.dumps({"row": "gpt student summary", "kind": kind, "seeds": a.seeds, "steps": a.gpt_student_steps,
                              "val_loss_mean": statistics.mean(v), "val_loss_min": min(v), "val_loss_max": max(v)}),
                  flush=True)


def decode_rate(fathom, d, tokens, env):
    out = subprocess.run([fathom, "generate", d, "--prompt", "And God said", "--tokens", str(tokens), "--seed", "1"],
                         check=True, capture_output=True, env=env, text=True).stderr
    line = [l for l in out.splitlines() if "tokens/s" in l][-1]  # "fathom: N tokens in S s (R tokens/s, KV cache)"
    return float(line.split("(")[1].split()[0])


def prune_gpt(a, fathom, env):
    teacher = kjv_teacher(a, fathom, env)
    rows = {}
    for name, kind, sp in (("control", "heads", 0.0), ("heads", "heads", a.gpt_sparsity), ("neurons", "channels", a.gpt_sparsity)):
        d = os.path.join(a.work, f"kjv-pruned-{name}")
        subprocess.run(["rm", "-rf", d], check=True)
        out = sh([fathom, "prune", teacher, "--structured", kind, "--sparsity", str(sp), "--finetune",
                  str(a.gpt_finetune_steps), "--seed", "1", "--quiet", "-o", d], env)
        val = float([l for l in out.splitlines() if "validation loss" in l][-1].split()[-1])
        params = [l for l in out.splitlines() if l.startswith("parameters:")][-1].split()[3]
        rows[name] = {"dir": d, "val_loss": val, "params": int(params)}
    rates = {k: [] for k in rows}
    for _ in range(a.rounds):
        for k, r in rows.items():
            rates[k].append(decode_rate(fathom, r["dir"], a.gpt_tokens, env))
    base = statistics.median(rates["control"])
    for k, r in rows.items():
        med = statistics.median(rates[k])
        print(json.dumps({"row": "gpt prune", "units": k, "sparsity": 0.0 if k == "control" else a.gpt_sparsity,
                          "finetune_steps": a.gpt_finetune_steps, "params": r["params"], "val_loss": r["val_loss"],
                          "decode_tokens_per_s": med, "speedup_vs_control": med / base}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--work", default="runs/bench_compress")
    ap.add_argument("--teacher-steps", type=int, default=2000)
    ap.add_argument("--finetune-steps", type=int, default=300)
    ap.add_argument("--finetune-lr", type=float, default=0.0005)
    ap.add_argument("--student-steps", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--temperature", type=float, default=2)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--skip-alone", action="store_true", help="only the distilled students (the alone runs do not depend on T, alpha)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["prune", "distill", "distill-gpt", "prune-gpt"])
    ap.add_argument("--gpt-sparsity", type=float, default=0.5)
    ap.add_argument("--gpt-finetune-steps", type=int, default=300)
    ap.add_argument("--gpt-tokens", type=int, default=120)
    ap.add_argument("--gpt-teacher-steps", type=int, default=1000)
    ap.add_argument("--gpt-student-steps", type=int, default=500)
    a = ap.parse_args()
    fathom = os.path.join(a.build, "fathom")
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, FATHOM_NUM_THREADS=str(a.threads))
    os.makedirs(a.work, exist_ok=True)
    if a.only == "distill-gpt":
        distill_gpt(a, fathom, src, env)
        return
    if a.only == "prune-gpt":
        prune_gpt(a, fathom, env)
        return
    teacher = os.path.join(a.work, "cnn")
    trained_now = not os.path.exists(os.path.join(teacher, "model.safetensors"))
    if trained_now:  # an existing teacher in --work is reused (its steps are what it was trained with)
        sh([fathom, "train", "fashion-cnn", "--steps", str(a.teacher_steps), "--out", teacher, "--quiet", "--json"], env)
    base = last_json(sh([fathom, "eval", teacher, "--json", "--quiet"], env))
    print(json.dumps({"row": "fashion-cnn", "steps": a.teacher_steps if trained_now else "reused", "test_accuracy":
                      base["test_accuracy"], "test_loss": base["test_loss"]}), flush=True)

    if a.only in (None, "prune"):
        raw, ft = os.path.join(a.work, "cnn-c50-raw"), os.path.join(a.work, "cnn-c50-ft")
        for d in (raw, ft):
            subprocess.run(["rm", "-rf", d], check=True)
        sh([fathom, "prune", teacher, "--sparsity", "0.5", "--structured", "channels", "-o", raw], env)
        r0 = last_json(sh([fathom, "eval", raw, "--json", "--quiet"], env))
        sh([fathom, "prune", teacher, "--sparsity", "0.5", "--structured", "channels", "--finetune",
            str(a.finetune_steps), "--lr", str(a.finetune_lr), "--quiet", "-o", ft], env)
        r1 = last_json(sh([fathom, "eval", ft, "--json", "--quiet"], env))
        print(json.dumps({"row": "prune channels 0.5", "finetune_steps": 0, "test_accuracy": r0["test_accuracy"],
                          "test_loss": r0["test_loss"]}), flush=True)
        print(json.dumps({"row": "prune channels 0.5", "finetune_steps": a.finetune_steps, "finetune_lr": a.finetune_lr,
                          "test_accuracy": r1["test_accuracy"], "test_loss": r1["test_loss"]}), flush=True)
        out = sh([os.path.join(a.build, "bench_prune"), teacher, ft, "--rounds", str(a.rounds)], env)
        for l in out.splitlines():
            if l.startswith("{"):
                print(json.dumps(dict(json.loads(l), row="prune speed")), flush=True)

    if a.only in (None, "distill"):
        ini = os.path.join(a.work, "fashion-cnn-half.ini")
        student_recipe(src, ini)
        res = {"distilled": [], "alone": []}
        for s in a.seeds:
            for kind in ("distilled",) if a.skip_alone else ("distilled", "alone"):
                tag = f"-T{a.temperature:g}-a{a.alpha:g}" if kind == "distilled" else ""
                out_dir = os.path.join(a.work, f"student-{kind}{tag}-{s}")
                subprocess.run(["rm", "-rf", out_dir], check=True)
                cmd = ([fathom, "distill", "--teacher", teacher, "--student", ini, "--temperature", str(a.temperature),
                        "--alpha", str(a.alpha)] if kind == "distilled" else [fathom, "train", ini])
                j = last_json(sh(cmd + ["--steps", str(a.student_steps), "--seed", str(s), "--out", out_dir, "--json",
                                        "--quiet"], env))
                res[kind].append(j)
                print(json.dumps({"row": "student", "kind": kind, "seed": s, "steps": a.student_steps,
                                  "temperature": a.temperature if kind == "distilled" else None,
                                  "alpha": a.alpha if kind == "distilled" else None,
                                  "test_accuracy": j["test_accuracy"], "test_loss": j["test_loss"]}), flush=True)
        for kind, js in res.items():
            if not js:
                continue
            acc = [j["test_accuracy"] for j in js]
            loss = [j["test_loss"] for j in js]
            print(json.dumps({"row": "student summary", "kind": kind, "seeds": a.seeds, "steps": a.student_steps,
                              "temperature": a.temperature if kind == "distilled" else None,
                              "alpha": a.alpha if kind == "distilled" else None,
                              "acc_mean": statistics.mean(acc), "acc_min": min(acc), "acc_max": max(acc),
                              "loss_mean": statistics.mean(loss), "loss_min": min(loss), "loss_max": max(loss)}), flush=True)


if __name__ == "__main__":
    main()
