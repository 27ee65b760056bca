import sys, time, statistics, torch
sys.path.insert(0, '.')
from attention_overhead import make_batch
from common import random_bert
import headlab
torch.manual_seed(0)
model = random_bert('tiny', torch.device('cpu'), torch.float32)
inputs, sid = make_batch(32, 128, model.config.vocab_size, True, torch.device('cpu'))
L, H = model.config.num_hidden_layers, model.config.num_attention_heads
P = lambda rules: headlab.HeadPlan.from_rules(rules, L, H)
variants = {
 'stock': None,
 'one drop': (P([{"heads": "L1H0", "policy": "drop_intra"}]), False),
 'one drop renorm': (P([{"heads": "L1H0", "policy": "drop_intra"}]), True),
 'half drop': (P([{"heads": "H0-1", "policy": "drop_intra"}]), False),
 'half drop renorm': (P([{"heads": "H0-1", "policy": "drop_intra"}]), True),
 'half prune': (P([{"heads": "H0-1", "policy": "prune"}]), False),
}
def run(v):
    if v is None: return model(**inputs)
    with headlab.ablate(model, v[0], renormalize=v[1]): return model(**inputs, sentence_ids=sid)
ratios = {k: [] for k in variants}
with torch.inference_mode():
    for k,v in variants.items(): run(v)
    for r in range(int(sys.argv[1])):
        t = {}
        for k,v in (variants.items() if r%2 else reversed(variants.items())):
            s=time.perf_counter(); run(v); run(v); run(v); t[k]=time.perf_counter()-s
        for k in t: ratios[k].append(t[k]/t['stock'])
print(' '.join(f"{k}={statistics.median(x):.3f}" for k,x in ratios.items()))
