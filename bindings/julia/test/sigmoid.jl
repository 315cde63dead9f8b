# The sigmoid (SigLIP) loss of Flatmem.jl against a Float64 materialised
# reference with derived error bounds: the same cases as the Rust binding's
# tests/sigmoid.rs and tests/ring_sigmoid.rs (shapes with 1 and primes, c > b
# and c < b with labels, s = 100 with t = -10, Float16 inputs, ds and dt by
# central finite differences, backward(g) exactly g times value_and_grad for a
# power-of-two g, errors naming the argument, the ring over 2 in-process ranks).
#
# CHECKED, NOT RUN: no Julia runtime exists on the project's machines (see
# ../README.md); scripts/check-julia.sh checks this directory's ccalls only.
# Run it where Julia >= 1.6 exists:
#     FLATMEM_LIBRARY=/path/to/prefix/lib/libflatmem.so julia -t 2 bindings/julia/test/sigmoid.jl
#
# Bounds (u = 2^-24, gamma_n = n u / (1 - n u), first order, times SLACK = 2;
# derived in tests/contrastive/sigmoid_reference.hpp): every logit within
# dx = s gamma_{d+2} A + u |t| (A = max_ij Σ_t |q_ti k_tj|); the loss within
# dx Σ|G| + 4u c + 2u |L|; each s G_ij within s |G_ij| (dx + 10u) plus an
# underflow floor s |g| / b 2^-125; dq sums c terms in fp32 (gamma_c), dk b
# terms (gamma_b); ds, dt in double, rounded to fp32; 16-bit outputs add half
# an ulp (and Float16 its subnormal floor).
using Test
using Random

include(joinpath(@__DIR__, "..", "Flatmem.jl"))
using .Flatmem

const U = 2.0^-24
const SLACK = 2.0
gamma(n) = n * U / (1 - n * U)

softplus(v) = max(v, 0.0) + log1p(exp(-abs(v)))
function sigm(v)
    e = exp(-abs(v))
    return v >= 0 ? 1 / (1 + e) : e / (1 + e)
end

# flatmem.h's sigmoid loss, literally, over d x b and d x c Float64 matrices;
# labels 1-based (or nothing: y_i = i); g the upstream gradient.
function reference(q, k, labels, s, t, g)
    d, b = size(q)
    c = size(k, 2)
    dq, dq_abs, dq_count = zeros(d, b), zeros(d, b), zeros(d, b)
    dk, dk_abs, dk_count = zeros(d, c), zeros(d, c), zeros(d, c)
    loss, ds, dt, A, sum_g, sum_gr = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    for i in 1:b, j in 1:c
        y = labels === nothing ? i : labels[i]
        dot = sum(q[:, i] .* k[:, j])
        mag = sum(abs.(q[:, i] .* k[:, j]))
        z = j == y ? 1.0 : -1.0
        v = -z * (s * dot + t)
        loss += softplus(v)
        G = g * -z * sigm(v) / b
        ds += G * dot
        dt += G
        A = max(A, mag)
        sum_g += abs(G)
        sum_gr += abs(G) * mag
        dq[:, i] .+= s * G .* k[:, j]
        dk[:, j] .+= s * G .* q[:, i]
        dq_abs[:, i] .+= abs.(G .* k[:, j])
        dk_abs[:, j] .+= abs.(G .* q[:, i])
        dq_count[:, i] .+= abs.(k[:, j])
        dk_count[:, j] .+= abs.(q[:, i])
    end
    return (loss=loss / b, dq=dq, dk=dk, ds=ds, dt=dt, A=A, sum_g=sum_g, sum_gr=sum_gr,
            dq_abs=dq_abs, dk_abs=dk_abs, dq_count=dq_count, dk_count=dk_count)
end

output_rounding(::Type{Float32}) = (0.0, 0.0)
output_rounding(::Type{Float16}) = (2.0^-11, 2.0^-25)

# The bounds above for reference r; `out` the gradients' element type.
function tolerance(r, b, c, d, s, t, g, out)
    dx = s * gamma(d + 2) * r.A + U * abs(t)
    sum_g1 = g != 0 ? r.sum_g / abs(g) : Float64(c)
    eps_g = dx + 10U
    under = abs(g) / b * 2.0^-125
    rel, floor = output_rounding(out)
    matrix(mag, count, value, n) = @. SLACK * s * ((eps_g + gamma(n)) * mag + under * count) * (1 + rel) +
                                      rel * abs(value) + floor
    return (loss=SLACK * (dx * sum_g1 + 4U * c + 2U * abs(r.loss)),
            dq=matrix(r.dq_abs, r.dq_count, r.dq, c), dk=matrix(r.dk_abs, r.dk_count, r.dk, b),
            ds=SLACK * ((eps_g + gamma(d)) * r.sum_gr + under * b * c * r.A) + 2U * abs(r.ds),
            dt=SLACK * (eps_g * r.sum_g + under * b * c) + 2U * abs(r.dt))
end

# q (d x b) with unit columns; k (d x c) whose first min(b, c) columns are
# noisy copies of q's (the diagonal positives), the rest unrelated.
function batch(rng, b, c, d)
    unit(x) = x ./ sqrt.(sum(abs2, x; dims=1))
    q = unit(randn(rng, d, b))
    p = min(b, c)
    k = hcat(unit(q[:, 1:p] .+ 0.5 .* randn(rng, d, p)), unit(randn(rng, d, c - p)))
    return Float32.(q), Float32.(k)
end

within(got, want, tol) = all(abs.(Float64.(got) .- want) .<= tol)

function check_grads(what, (dq, dk, ds, dt), r, tol)
    @testset "$what" begin
        @test within(dq, r.dq, tol.dq)
        @test within(dk, r.dk, tol.dk)
        @test abs(ds - r.ds) <= tol.ds
        @test abs(dt - r.dt) <= tol.dt
    end
end

function check_case(b, c, d; T=Float32, labels=false, s=10.0f0, t=-10.0f0, g=0.75f0, tiles=(0, 0), threads=2)
    rng = MersenneTwister(b * 1_000_003 + c * 1009 + d)
    q32, k32 = batch(rng, b, c, d)
    q, k = T.(q32), T.(k32)
    lab = labels ? rand(rng, 1:c, b) : nothing
    q64, k64 = Float64.(q), Float64.(k)
    h = Contrastive(; loss=:sigmoid, num_threads=threads, tile_rows=tiles[1], tile_cols=tiles[2])
    @testset "b=$b c=$c d=$d $T labels=$labels s=$s t=$t tiles=$tiles" begin
        r1 = reference(q64, k64, lab, s, t, 1.0)
        tol1 = tolerance(r1, b, c, d, s, t, 1.0, T)
        L, dq, dk, ds, dt = sigmoid_value_and_grad(h, q, k, s, t; labels=lab)
        @test abs(L - r1.loss) <= tol1.loss
        @test eltype(dq) === T && size(dq) == (d, b) && size(dk) == (d, c)
        check_grads("value_and_grad", (dq, dk, ds, dt), r1, tol1)
        @test sigmoid_forward(h, q, k, s, t; labels=lab) === L

        rg = reference(q64, k64, lab, s, t, Float64(g))
        tolg = tolerance(rg, b, c, d, s, t, g, T)
        check_grads("backward g=$g", sigmoid_backward(h, q, k, s, t, g; labels=lab), rg, tolg)

        # the closure: fp32 gradients times g (one more fp32 rounding: u |value|)
        L2, back = sigmoid_loss(h, q, k, s, t; labels=lab)
        @test L2 === L
        extra = (dq=tolg.dq .+ U .* abs.(rg.dq), dk=tolg.dk .+ U .* abs.(rg.dk),
                 ds=tolg.ds + U * abs(rg.ds), dt=tolg.dt + U * abs(rg.dt))
        check_grads("sigmoid_loss backward g=$g", back(g), rg, extra)
        @test sigmoid_workspace_size(h, q, k) >= 0
    end
    close(h)
end

@testset "Flatmem.jl sigmoid loss" begin
    @testset "shapes with 1 and primes, diagonal positives" begin
        for (b, d) in [(1, 1), (1, 97), (2, 3), (5, 13), (13, 7), (31, 17)]
            check_case(b, b, d)
            check_case(b, b, d; tiles=(4, 3), threads=3)
        end
        check_case(5, 11, 7)    # c > b without labels: extra negatives
    end
    @testset "labels: c > b, c = b, c < b" begin
        for (b, c, d) in [(1, 5, 3), (3, 7, 5), (7, 3, 4), (17, 17, 1), (37, 101, 19)]
            check_case(b, c, d; labels=true)
            check_case(b, c, d; labels=true, tiles=(17, 5), threads=4)
        end
    end
    @testset "s = 100, t = -10 and a positive bias" begin
        check_case(97, 97, 7; s=100.0f0, t=-10.0f0, tiles=(16, 24))
        check_case(31, 67, 33; s=100.0f0, t=-10.0f0, labels=true)
        check_case(41, 41, 9; s=3.0f0, t=5.0f0)
    end
    @testset "Float16 inputs and gradients" begin
        check_case(13, 13, 11; T=Float16)
        check_case(7, 19, 5; T=Float16, labels=true, tiles=(4, 4))
        check_case(29, 29, 33; T=Float16, s=100.0f0, t=-10.0f0)
    end

    @testset "ds and dt by central finite differences" begin
        # budget: each loss within its bound, plus h^2 / 6 max|L'''|, |L'''| <=
        # c / (6 sqrt 3) for t and c A^3 / (6 sqrt 3) for s
        for (b, c, d, s, t, labels) in [(17, 17, 6, 10.0f0, -10.0f0, false), (13, 29, 5, 4.0f0, 2.0f0, true),
                                        (11, 11, 4, 100.0f0, -10.0f0, false)]
            rng = MersenneTwister(b + c + d)
            q, k = batch(rng, b, c, d)
            lab = labels ? rand(rng, 1:c, b) : nothing
            h = Contrastive(; loss=:sigmoid, tile_rows=8, tile_cols=8)
            _, _, _, ds, dt = sigmoid_value_and_grad(h, q, k, s, t; labels=lab)
            r = reference(Float64.(q), Float64.(k), lab, s, t, 1.0)
            tol = tolerance(r, b, c, d, s, t, 1.0, Float32)
            third = c / (6 * sqrt(3.0))
            function quotient(at)
                L = [Float64(sigmoid_forward(h, q, k, at(side)...; labels=lab)) for side in (-1, 1)]
                budget = sum(side -> begin
                                 ss, tt = at(side)
                                 rs = reference(Float64.(q), Float64.(k), lab, ss, tt, 1.0)
                                 tolerance(rs, b, c, d, ss, tt, 1.0, Float32).loss
                             end, (-1, 1))
                return L, budget
            end
            step_t = 1.0f-2
            (Lt, bt) = quotient(side -> (s, t + side * step_t))
            wt = Float64((t + step_t) - (t - step_t))
            @test abs(dt - (Lt[2] - Lt[1]) / wt) <= bt / wt + wt^2 / 24 * third + tol.dt
            step_s = Float32(1e-2 / max(1.0, r.A))
            (Ls, bs) = quotient(side -> (s + side * step_s, t))
            ws = Float64((s + step_s) - (s - step_s))
            @test abs(ds - (Ls[2] - Ls[1]) / ws) <= bs / ws + ws^2 / 24 * third * r.A^3 + tol.ds
            close(h)
        end
    end

    @testset "backward(g) is exactly g times value_and_grad (g a power of two)" begin
        q, k = batch(MersenneTwister(5), 13, 13, 7)
        h = Contrastive(; loss=:sigmoid)
        _, dq, dk, ds, dt = sigmoid_value_and_grad(h, q, k, 10.0f0, -10.0f0)
        for g in (1.0f0, -2.0f0, 0.25f0)
            @test sigmoid_backward(h, q, k, 10.0f0, -10.0f0, g) == (g .* dq, g .* dk, g * ds, g * dt)
        end
        close(h)
    end

    @testset "bad input names the argument" begin
        q, k = batch(MersenneTwister(9), 3, 4, 2)
        h = Contrastive(; loss=:sigmoid)
        message(f) = try
            f()
            "no error"
        catch e
            e isa FlatmemError ? e.message : sprint(showerror, e)
        end
        for s in (0.0f0, -1.0f0, NaN32, Inf32)
            @test occursin("logit_scale", message(() -> sigmoid_forward(h, q, k, s, -10.0f0)))
        end
        for t in (NaN32, Inf32)
            @test occursin("logit_bias", message(() -> sigmoid_value_and_grad(h, q, k, 10.0f0, t)))
        end
        @test occursin("labels", message(() -> sigmoid_forward(h, q, k, 10.0f0, -10.0f0; labels=[1, 5, 2])))
        @test occursin("labels", message(() -> sigmoid_forward(h, q, k, 10.0f0, -10.0f0; labels=[1, 2])))
        @test occursin("c >= b", message(() -> sigmoid_forward(h, q, k[:, 1:2], 10.0f0, -10.0f0)))
        @test occursin("same d", message(() -> sigmoid_forward(h, q, vcat(k, k), 10.0f0, -10.0f0)))
        @test occursin("dloss", message(() -> sigmoid_backward(h, q, k, 10.0f0, -10.0f0, NaN32)))
        @test occursin("sigmoid_loss", message(() -> contrastive_loss(h, q, k, 10.0f0)))
        @test occursin("sigmoid", message(() -> sigmoid_forward(Contrastive(), q, k, 10.0f0, -10.0f0)))
        @test occursin("logit_cache_bytes", message(() -> Contrastive(; loss=:sigmoid, logit_cache_bytes=1 << 20)))
        close(h)
    end

    @testset "ring over 2 in-process ranks equals the global batch" begin
        @test Threads.nthreads() >= 2   # julia -t 2: each rank blocks its own thread
        rows, cols, d, s, t, g = [3, 2], [4, 7], 6, 10.0f0, -10.0f0, 0.75f0
        B, C = sum(rows), sum(cols)
        rng = MersenneTwister(17)
        q, k = batch(rng, B, C, d)
        lab = rand(rng, 1:C, B)
        r = reference(Float64.(q), Float64.(k), lab, s, t, Float64(g))
        tol = tolerance(r, B, C, d, s, t, g, Float32)
        r1 = reference(Float64.(q), Float64.(k), lab, s, t, 1.0)
        tol1 = tolerance(r1, B, C, d, s, t, 1.0, Float32)
        comms = local_comms(2; timeout_ms=10_000)
        results = fetch.([Threads.@spawn begin
                              rank = comm.rank
                              qr = (sum(rows[1:rank]) + 1):sum(rows[1:(rank + 1)])
                              kr = (sum(cols[1:rank]) + 1):sum(cols[1:(rank + 1)])
                              h = Contrastive(; loss=:sigmoid, num_threads=1, comm=comm)
                              L, back = sigmoid_loss(h, q[:, qr], k[:, kr], s, t; labels=lab[qr])
                              grads = back(g)
                              close(h)
                              (qr, kr, L, grads)
                          end for comm in comms])
        for (qr, kr, L, (dq, dk, ds, dt)) in results
            @test abs(L - r1.loss) <= tol1.loss
            @test within(dq, r.dq[:, qr], tol.dq[:, qr] .+ U .* abs.(r.dq[:, qr]))
            @test within(dk, r.dk[:, kr], tol.dk[:, kr] .+ U .* abs.(r.dk[:, kr]))
            @test abs(ds - r.ds) <= tol.ds + U * abs(r.ds)
            @test abs(dt - r.dt) <= tol.dt + U * abs(r.dt)
        end
        foreach(close, comms)
    end
end
