"""Baseline of `swelake bench relevance`: Python onnxruntime encoding the same token ids the stage
embeds (mean-pooled, normalised MiniLM vectors). Prints {"chunks", "seconds"} as JSON.
Usage: ort_baseline.py MODEL.onnx IDS.json THREADS BATCH"""
import json, sys, time
import numpy as np
import onnxruntime as ort
model, ids_file, threads, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids = json.load(open(ids_file))
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
t = time.perf_counter()
out = [None] * len(ids)
for s in range(0, len(order), batch):
    b = order[s:s + batch]
    n = max(len(ids[i]) for i in b)
    x = np.zeros((len(b), n), dtype=np.int64)
    m = np.zeros((len(b), n), dtype=np.int64)
    for r, i in enumerate(b):
        x[r, :len(ids[i])] = ids[i]
        m[r, :len(ids[i])] = 1
    h = sess.run(["last_hidden_state"], {"input_ids": x, "attention_mask": m, "token_type_ids": np.zeros_like(x)})[0]
    v = (h * m[:, :, None]).sum(1) / m.sum(1, keepdims=True)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    for r, i in enumerate(b):
        out[i] = v[r]
dt = time.perf_counter() - t
print(json.dumps({"chunks": len(ids), "seconds": dt}))
