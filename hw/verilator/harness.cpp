// The INA core (Verilated) behind a C ABI: datagrams in, beats through the RTL, datagrams
// out. Loaded with ctypes by ina_fabric.hw.verilator.core (which builds this file with
// the Verilog of hw/ina and a generated ports.h that holds the stream layouts' offsets).
//
// One cycle (step): with clk low, drive the input beat (valid when one is queued) and
// o.ready = 1, settle, sample the handshakes (the values before the edge, as cocotb
// sees them), then the rising edge. A datagram's time is the cycle its first beat was
// accepted (the core's ``now`` then, and this harness's 64-bit count).

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "Vina_core.h"
#include "verilated.h"
#include "ports.h"   // LANES, HEADER_WORDS, IN_*/OUT_* field offsets and widths

// Verilator spells the double underscores of Amaranth's port names as ___05F
#define I__VALID i___05Fvalid
#define I__READY i___05Fready
#define I__PAYLOAD i___05Fpayload
#define O__VALID o___05Fvalid
#define O__READY o___05Fready
#define O__PAYLOAD o___05Fpayload
#define CFG__ADDR cfg___05Faddr
#define CFG__W_STB cfg___05Fw_stb
#define CFG__W_DATA cfg___05Fw_data
#define CFG__R_DATA cfg___05Fr_data

namespace {

inline void put_bits(uint32_t* w, int off, int width, uint64_t v) {
    if (width == 32 && (off & 31) == 0) { w[off >> 5] = (uint32_t)v; return; }
    for (int k = 0; k < width; ++k) {
        int b = off + k;
        uint32_t m = 1u << (b & 31);
        if ((v >> k) & 1) w[b >> 5] |= m; else w[b >> 5] &= ~m;
    }
}

inline uint64_t get_bits(const uint32_t* w, int off, int width) {
    if (width == 32 && (off & 31) == 0) return w[off >> 5];
    uint64_t v = 0;
    for (int k = 0; k < width; ++k) {
        int b = off + k;
        v |= (uint64_t)((w[b >> 5] >> (b & 31)) & 1) << k;
    }
    return v;
}

constexpr int IN_W = (IN_BITS + 31) / 32;
constexpr int OUT_W = (OUT_BITS + 31) / 32;

struct OutDatagram {
    std::vector<uint8_t> bytes;
    uint64_t meta[8];   // dst_ip, dst_port, mcast, length, ip_checksum, dst_mac, first cycle
};

struct Sim {
    VerilatedContext ctx;
    Vina_core* top;
    uint64_t cycle = 0;
    std::deque<std::vector<uint32_t>> in_beats;   // packed input payloads
    std::deque<bool> in_first;                    // per queued beat: a datagram's first
    std::deque<uint64_t> accepted;                // first-beat cycles, in order
    std::deque<OutDatagram> outq;
    OutDatagram cur;
    bool cur_open = false;
    // statistics
    uint64_t in_beats_n = 0, in_stall = 0, out_beats_n = 0, out_dgrams = 0, in_dgrams = 0;
    uint64_t busy_cycles = 0;   // cycles with a beat waiting or accepted

    Sim() { top = new Vina_core(&ctx); top->clk = 0; top->rst = 0; top->eval(); }
    ~Sim() { top->final(); delete top; }

    void step() {
        top->clk = 0;
        bool have = !in_beats.empty();
        top->I__VALID = have;
        if (have) std::memcpy(top->I__PAYLOAD.data(), in_beats.front().data(), IN_W * 4);
        top->O__READY = 1;
        top->eval();
        if (have) {
            ++busy_cycles;
            if (top->I__READY) {
                if (in_first.front()) accepted.push_back(cycle);
                in_beats.pop_front();
                in_first.pop_front();
                ++in_beats_n;
            } else {
                ++in_stall;
            }
        }
        if (top->O__VALID) take_out();
        top->clk = 1;
        top->eval();
        top->CFG__W_STB = 0;
        ++cycle;
    }

    void take_out() {
        const uint32_t* p = top->O__PAYLOAD.data();
        ++out_beats_n;
        if (get_bits(p, OUT_FIRST_OFF, 1)) {
            cur.bytes.clear();
            cur.meta[0] = get_bits(p, OUT_DST_IP_OFF, 32);
            cur.meta[1] = get_bits(p, OUT_DST_PORT_OFF, 16);
            cur.meta[2] = get_bits(p, OUT_MCAST_OFF, 1);
            cur.meta[3] = get_bits(p, OUT_LENGTH_OFF, 16);
            cur.meta[4] = get_bits(p, OUT_IP_CHECKSUM_OFF, 16);
            cur.meta[5] = get_bits(p, OUT_DST_MAC_OFF, 48);
            cur.meta[6] = cycle;
            cur.meta[7] = 0;
            cur_open = true;
        }
        int n = (int)get_bits(p, OUT_N_OFF, OUT_N_WIDTH);
        for (int j = 0; j < n && j < LANES; ++j) {
            uint32_t w = (uint32_t)get_bits(p, OUT_DATA_OFF + 32 * j, 32);
            uint8_t b[4] = {(uint8_t)(w >> 24), (uint8_t)(w >> 16), (uint8_t)(w >> 8),
                            (uint8_t)w};
            cur.bytes.insert(cur.bytes.end(), b, b + 4);
        }
        if (get_bits(p, OUT_LAST_OFF, 1)) {
            if (cur_open) outq.push_back(cur);
            cur_open = false;
            ++out_dgrams;
        }
    }

    void push(const uint8_t* d, int len, uint32_t src_ip, uint32_t src_port) {
        int words = (len + 3) / 4;
        std::vector<uint32_t> wv(words, 0);
        for (int i = 0; i < len; ++i) wv[i / 4] |= (uint32_t)d[i] << (8 * (3 - i % 4));
        // the header words fill the first beats; the elements start on a fresh beat
        std::vector<std::pair<int, int>> parts;   // (first word, count) per beat
        int hw = words < HEADER_WORDS ? words : HEADER_WORDS;
        for (int k = 0; k < hw; k += LANES) parts.push_back({k, hw - k < LANES ? hw - k : LANES});
        for (int k = hw; k < words; k += LANES)
            parts.push_back({k, words - k < LANES ? words - k : LANES});
        bool empty = parts.empty();
        if (empty) parts.push_back({0, 1});      // an empty datagram still takes one beat
        for (size_t b = 0; b < parts.size(); ++b) {
            std::vector<uint32_t> beat(IN_W, 0);
            int n = parts[b].second;
            for (int j = 0; j < n; ++j) {
                uint32_t w = empty ? 0 : wv[parts[b].first + j];
                put_bits(beat.data(), IN_DATA_OFF + 32 * j, 32, w);
            }
            put_bits(beat.data(), IN_N_OFF, IN_N_WIDTH, n);
            put_bits(beat.data(), IN_FIRST_OFF, 1, b == 0);
            put_bits(beat.data(), IN_LAST_OFF, 1, b + 1 == parts.size());
            put_bits(beat.data(), IN_LENGTH_OFF, 16, len);
            put_bits(beat.data(), IN_SRC_IP_OFF, 32, src_ip);
            put_bits(beat.data(), IN_SRC_PORT_OFF, 16, src_port);
            in_beats.push_back(std::move(beat));
            in_first.push_back(b == 0);
        }
        ++in_dgrams;
    }
};

}  // namespace

extern "C" {

void* ina_new() { return new Sim(); }
void ina_free(void* s) { delete (Sim*)s; }

void ina_reset(void* sp, int cycles) {
    Sim* s = (Sim*)sp;
    s->top->rst = 1;
    s->top->CFG__W_STB = 0;
    for (int k = 0; k < cycles; ++k) s->step();
    s->top->rst = 0;
    s->step();
}

void ina_write(void* sp, uint32_t addr, uint32_t value) {
    Sim* s = (Sim*)sp;
    s->top->CFG__ADDR = addr;
    s->top->CFG__W_DATA = value;
    s->top->CFG__W_STB = 1;
    s->step();     // the strobe is taken at this edge (and cleared after it)
}

uint32_t ina_read(void* sp, uint32_t addr, int latency) {
    Sim* s = (Sim*)sp;
    s->top->CFG__ADDR = addr;
    for (int k = 0; k < latency; ++k) s->step();
    s->top->clk = 0;
    s->top->eval();
    return s->top->CFG__R_DATA;
}

void ina_push(void* sp, const uint8_t* d, int len, uint32_t src_ip, uint32_t src_port) {
    ((Sim*)sp)->push(d, len, src_ip, src_port);
}

// Run until the input is consumed and the output has been idle for ``drain`` cycles
// (no datagram half sent), or for ``max_cycles``; returns the cycles run.
uint64_t ina_run(void* sp, uint64_t max_cycles, uint32_t drain) {
    Sim* s = (Sim*)sp;
    uint64_t start = s->cycle, idle = 0;
    while (s->cycle - start < max_cycles) {
        uint64_t before = s->out_beats_n;
        s->step();
        if (s->in_beats.empty() && !s->cur_open && s->out_beats_n == before) {
            if (++idle >= drain) break;
        } else {
            idle = 0;
        }
    }
    return s->cycle - start;
}

uint64_t ina_step(void* sp, uint64_t n) {
    Sim* s = (Sim*)sp;
    for (uint64_t k = 0; k < n; ++k) s->step();
    return s->cycle;
}

uint64_t ina_cycle(void* sp) { return ((Sim*)sp)->cycle; }

// first-beat cycles of the datagrams accepted since the last call, in order
int ina_accepted(void* sp, uint64_t* out, int cap) {
    Sim* s = (Sim*)sp;
    int n = 0;
    while (n < cap && !s->accepted.empty()) {
        out[n++] = s->accepted.front();
        s->accepted.pop_front();
    }
    return n;
}

int ina_pending_in(void* sp) { return (int)((Sim*)sp)->in_beats.size(); }
int ina_out_count(void* sp) { return (int)((Sim*)sp)->outq.size(); }

// the oldest output datagram: its bytes into buf (returns the length, or -1 if none or
// longer than cap), and meta[8] (dst_ip, dst_port, mcast, length, ip_checksum, dst_mac,
// first-beat cycle, 0)
int ina_pop_out(void* sp, uint8_t* buf, int cap, uint64_t* meta) {
    Sim* s = (Sim*)sp;
    if (s->outq.empty()) return -1;
    OutDatagram& o = s->outq.front();
    int n = (int)o.bytes.size();
    if (n > cap) return -1;
    std::memcpy(buf, o.bytes.data(), n);
    std::memcpy(meta, o.meta, sizeof o.meta);
    s->outq.pop_front();
    return n;
}

// cycles, input beats, input stall cycles (a beat waiting, ready low), output beats,
// output datagrams, input datagrams, busy cycles (a beat waiting or taken)
void ina_stats(void* sp, uint64_t* out) {
    Sim* s = (Sim*)sp;
    out[0] = s->cycle; out[1] = s->in_beats_n; out[2] = s->in_stall;
    out[3] = s->out_beats_n; out[4] = s->out_dgrams; out[5] = s->in_dgrams;
    out[6] = s->busy_cycles;
}

}  // extern "C"
