// Keeps one SM busy for `cycles` clock cycles. The benchmarks launch it before a timed batch of
// calls, so the host can enqueue the whole batch while the GPU waits: the events around the
// batch then measure device time alone, without the host's launch overhead.
extern "C" __global__ void spin(long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
