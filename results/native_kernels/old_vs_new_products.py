import time, torch, sys, statistics
from torch.utils.cpp_extension import load
old = load(name="oldk", sources=[f"/tmp/k/old/{f}" for f in ("products.cpp","dense.cpp","attention.cpp","bindings.cpp")], extra_cflags=["-O3","-ffp-contract=off","-fopenmp","-std=c++17"], extra_ldflags=["-fopenmp"], build_directory="/tmp/k/old")
from speculant.kernels import native
from speculant.layers import packing
from speculant.layers.quant import quantize_int4, quantize_int8
new = native.module()
torch.manual_seed(0); torch.set_num_threads(int(sys.argv[1]))
def pack_nibbles(q):
    out, n_in = q.shape
    g = q.to(torch.uint8).view(out, n_in // 32, 32)
    return (g[..., :16] | (g[..., 16:] << 4)).reshape(out, n_in // 2).contiguous()
clock = time.perf_counter if int(sys.argv[1]) > 1 else time.process_time
print("shape | kernel | " + " | ".join(f"{T} rows" for T in [1,2,5,8,16]))
for (n,k) in [(3072,576),(576,1536),(49152,576)]:
    w=torch.randn(n,k)
    if n==49152:
        g=quantize_int8(w); pk=packing.pack_int8(g)
        fo=lambda x: old.int8_linear(x,g.q,g.scale.float(),True); fn=lambda x: new.int8_linear(x,*pk,n,True)
    else:
        g=quantize_int4(w); a=(pack_nibbles(g.q), g.scale.float().contiguous(), (g.zero-8*g.scale).float().contiguous()); pk=packing.pack_int4(g)
        fo=lambda x: old.int4_linear(x,*a,True); fn=lambda x: new.int4_linear(x,*pk,n,True)
    res={"old":{}, "new":{}}
    for T in [1,2,5,8,16]:
        x=torch.randn(T,k); to=[]; tn=[]
        for _ in range(40):
            t=clock(); fo(x); to.append(clock()-t)
            t=clock(); fn(x); tn.append(clock()-t)
        res["old"][T]=statistics.median(to)*1e6; res["new"][T]=statistics.median(tn)*1e6
    for kname in ("old","new"):
        r=res[kname]; print(f"{n}x{k} {'int8' if n==49152 else 'int4'} | {kname} | " + " | ".join(f"{r[T]:.0f} ({r[T]/r[1]:.2f}x)" for T in r))
