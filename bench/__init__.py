"""Benchmarks, installed with the package so that `bigs bench NAME` runs from a wheel as from a checkout.

    torch_forward.py       `bigs bench torch-forward`: SSM formulations in torch eager
    load.py, locustfile.py `bigs bench load`: locust, headless, against a running service
    peer.py                `bigs bench peer`: our service against a peer embedding server, OpenAI route
    text_corpus.py         real English cut to exact token counts: the request texts of the above
    export_latency.py      ORT per bucket beside torch eager; memory of shared weights (a script)
    service_throughput.py  batching on and off, 4,096-token documents (a script)
    precision.py           `bigs bench precision`: fp32, int8 and bf16 variants of an export dir side by side
    compare.py             `bigs bench compare`: BiGS vs same-size BERT, dense-FLOP floors, batching
    default_size.py        `bigs bench default-size`: which size the default models can be (4,096-token latency, MB shipped)
    graph_profile.py       `bigs bench graph-profile`: where a bucket's time goes by op category, under ORT's
                           profiler or OpenVINO's counters; the dense-MatMul floor
    train_step.py          `bigs bench train`: one training step on this CPU, split, beside its floor
    accelerator.py         `bigs bench accelerator`: training, exact resume and serving on a GPU, in a time budget
    window.py              a GPU window's one call: the fill-mask default distilled there and shipped back as
                           fp16 shards (`python -m bench.window`, scripts/gpu_train.sh), then the paper shape's speed

What they measured is in bench/RESULTS.md (not installed).
"""
