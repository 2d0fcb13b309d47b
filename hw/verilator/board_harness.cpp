// The Versa board's datapath (hw/boards/datapath.py: two Ethernet ports, MAC, ARP/IPv4/
// UDP/ICMP, the in-band control plane, the INA core, the replicator), Verilated, behind a
// C ABI that hands it Ethernet frames. Loaded with ctypes by ina_fabric.hw.verilator.board.
//
// Where the frames enter: at GMII, behind the RGMII DDR wrapper (hw/eth/rgmii.py, which
// is ECP5 I/O primitives and is not simulated). A frame pushed here (as a TAP gives it:
// destination MAC to payload, no FCS) is sent as the PHY would: padded to 60 bytes as
// the sending NIC's MAC pads it, then 7 bytes 0x55, the SFD 0xd5, the frame, its FCS
// (CRC-32), one byte per receive-clock cycle with rx_dv high, 12 idle bytes between
// frames. What the board transmits (tx_en high) is collected a byte per transmit-clock
// cycle; its preamble and SFD are checked and removed and its FCS checked and removed
// (a frame with a bad preamble or FCS is counted and not delivered), so what comes out
// is the frame the kernel would get from a NIC.
//
// Clocks, at the board's ratios (constraints/versa_ecp5.toml): ``sync`` and both
// transmit domains 125 MHz (one PLL output), ``core`` 75 MHz (the PLL's other output,
// VCO 750 MHz / 10), each port's receive clock 125 MHz from its PHY, a third of a
// ``sync`` period out of phase. Time runs in ticks of 40 ns / 15: ``sync`` rises every
// 3 ticks (at 0), the receive clocks every 3 (at 1), ``core`` every 5 (at 0).

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include <poll.h>
#include <unistd.h>

#include "Vina_board.h"
#include "verilated.h"

namespace {

constexpr int PERIOD = 15;          // ticks in 40 ns: 5 sync, 3 core cycles
constexpr int NPORTS = 2;
constexpr int COUNTERS = 24;        // hw/eth/port.py PORT_COUNTERS (checked by board.py)

uint32_t crc_table[256];
struct CrcInit {
    CrcInit() {
        for (uint32_t n = 0; n < 256; ++n) {
            uint32_t c = n;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            crc_table[n] = c;
        }
    }
} crc_init;

uint32_t crc32(const uint8_t* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

struct RxPort {                       // frames on their way into the board
    std::deque<std::vector<uint8_t>> q;   // whole GMII byte streams (preamble to FCS)
    size_t pos = 0;                   // next byte of q.front()
    int gap = 0;                      // idle bytes still owed after the last frame
};

struct TxPort {                       // frames the board sends
    std::vector<uint8_t> cur;
    bool on = false;
    std::deque<std::vector<uint8_t>> out;   // frames without preamble and FCS
};

struct Stats {
    uint64_t ticks = 0, sync_cycles = 0, core_cycles = 0;
    uint64_t rx_frames[NPORTS] = {0, 0}, tx_frames[NPORTS] = {0, 0};
    uint64_t tx_bad[NPORTS] = {0, 0}, tx_er[NPORTS] = {0, 0};
    uint64_t tx_undelivered[NPORTS] = {0, 0};   // no TAP on that port, or its write failed
    uint64_t rx_dropped[NPORTS] = {0, 0};       // from the TAP, longer than a frame can be
    uint64_t sim_ns = 0;                        // wall time spent simulating
};

struct Board {
    VerilatedContext ctx;
    Vina_board* top;
    uint64_t tick = 0;
    uint64_t idle = 0;                // sync cycles since the last GMII byte either way
    RxPort rx[NPORTS];
    TxPort tx[NPORTS];
    Stats st;

    Board() {
        top = new Vina_board(&ctx);
        top->clk = top->core_clk = 0;
        top->eth_rx0_clk = top->eth_rx1_clk = top->eth_tx0_clk = top->eth_tx1_clk = 0;
        top->p0_rx_dv = top->p1_rx_dv = 0;
        top->cfg_addr = 0;
        top->eval();
    }
    ~Board() { top->final(); delete top; }

    void set_reset(int v) {
        top->rst = top->core_rst = v;
        top->eth_rx0_rst = top->eth_rx1_rst = top->eth_tx0_rst = top->eth_tx1_rst = v;
    }

    // drive the next receive byte of port p (called just before its clock rises)
    void drive_rx(int p) {
        RxPort& r = rx[p];
        uint8_t dv = 0, d = 0;
        if (r.gap > 0) {
            --r.gap;
        } else if (!r.q.empty()) {
            std::vector<uint8_t>& f = r.q.front();
            dv = 1;
            d = f[r.pos++];
            if (r.pos == f.size()) {
                r.q.pop_front();
                r.pos = 0;
                r.gap = 12;
                ++st.rx_frames[p];
            }
        }
        if (dv) idle = 0;
        if (p == 0) { top->p0_rx_dv = dv; top->p0_rxd = d; top->p0_rx_er = 0; }
        else        { top->p1_rx_dv = dv; top->p1_rxd = d; top->p1_rx_er = 0; }
    }

    // sample what port p transmits in the cycle that just began
    void sample_tx(int p) {
        TxPort& t = tx[p];
        uint8_t en = p == 0 ? top->p0_tx_en : top->p1_tx_en;
        uint8_t er = p == 0 ? top->p0_tx_er : top->p1_tx_er;
        uint8_t d = p == 0 ? top->p0_txd : top->p1_txd;
        if (en) {
            idle = 0;
            if (er) ++st.tx_er[p];
            t.cur.push_back(d);
            t.on = true;
        } else if (t.on) {
            t.on = false;
            finish_tx(p);
        }
    }

    void finish_tx(int p) {
        std::vector<uint8_t>& f = tx[p].cur;
        static const uint8_t pre[8] = {0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0xD5};
        bool ok = f.size() >= 8 + 64 && std::memcmp(f.data(), pre, 8) == 0;
        if (ok) {
            size_t n = f.size() - 8 - 4;
            uint32_t fcs = f[8 + n] | f[8 + n + 1] << 8 | f[8 + n + 2] << 16 |
                           (uint32_t)f[8 + n + 3] << 24;
            ok = crc32(f.data() + 8, n) == fcs;
            if (ok) {
                tx[p].out.emplace_back(f.begin() + 8, f.begin() + 8 + n);
                ++st.tx_frames[p];
            }
        }
        if (!ok) ++st.tx_bad[p];
        f.clear();
    }

    // one tick: the clocks that rise at this tick rise (after a falling edge eval)
    void step_tick() {
        int ph = (int)(tick % PERIOD);
        bool s = ph % 3 == 0, r = ph % 3 == 1, c = ph % 5 == 0;
        if (!(s || r || c)) { ++tick; return; }
        // falling edges first (nothing in the design uses them; Verilator needs them)
        top->clk = top->eth_tx0_clk = top->eth_tx1_clk = 0;
        top->eth_rx0_clk = top->eth_rx1_clk = 0;
        top->core_clk = 0;
        top->eval();
        if (r) { drive_rx(0); drive_rx(1); }
        if (s) { top->clk = top->eth_tx0_clk = top->eth_tx1_clk = 1; }
        if (r) { top->eth_rx0_clk = top->eth_rx1_clk = 1; }
        if (c) { top->core_clk = 1; ++st.core_cycles; }
        top->eval();
        if (s) {
            ++st.sync_cycles;
            ++idle;
            sample_tx(0);
            sample_tx(1);
        }
        ++tick;
    }

    void run_sync(uint64_t n) {
        uint64_t end = st.sync_cycles + n;
        while (st.sync_cycles < end) step_tick();
    }

    bool busy() const {
        for (int p = 0; p < NPORTS; ++p)
            if (!rx[p].q.empty() || tx[p].on) return true;
        return false;
    }

    int push(int p, const uint8_t* d, int len) {
        if (p < 0 || p >= NPORTS || len < 14 || len > 1518) return -1;
        std::vector<uint8_t> f(8, 0x55);
        f[7] = 0xD5;
        f.insert(f.end(), d, d + len);
        while (f.size() < 8 + 60) f.push_back(0);     // the sender's MAC pads to 60
        uint32_t c = crc32(f.data() + 8, f.size() - 8);
        for (int k = 0; k < 4; ++k) f.push_back((uint8_t)(c >> (8 * k)));
        rx[p].q.push_back(std::move(f));
        return 0;
    }
};

inline uint64_t now_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

extern "C" {

void* board_new() { return new Board(); }
void board_free(void* b) { delete (Board*)b; }

// reset every domain for ``cycles`` sync cycles (and at least 2 core cycles), release it
void board_reset(void* bp, int cycles) {
    Board* b = (Board*)bp;
    b->set_reset(1);
    b->run_sync(cycles < 4 ? 4 : cycles);
    b->set_reset(0);
    b->run_sync(2);
}

int board_cfg_done(void* bp) { return ((Board*)bp)->top->cfg_done; }

uint64_t board_run(void* bp, uint64_t sync_cycles) {
    Board* b = (Board*)bp;
    uint64_t t = now_ns();
    b->run_sync(sync_cycles);
    b->st.sim_ns += now_ns() - t;
    return b->st.sync_cycles;
}

// a frame (destination MAC .. payload, no FCS) into port p; -1: not a frame
int board_push(void* bp, int p, const uint8_t* d, int len) { return ((Board*)bp)->push(p, d, len); }

// the oldest frame port p sent (no preamble, no FCS): its length, or -1 when none
int board_pop(void* bp, int p, uint8_t* buf, int cap) {
    Board* b = (Board*)bp;
    if (p < 0 || p >= NPORTS || b->tx[p].out.empty()) return -1;
    std::vector<uint8_t>& f = b->tx[p].out.front();
    int n = (int)f.size();
    if (n > cap) return -1;
    std::memcpy(buf, f.data(), n);
    b->tx[p].out.pop_front();
    return n;
}

// a core register through the datapath's status port (cfg_addr crosses into ``core``
// and cfg_data back through FFSynchronizers: held 24 sync cycles, as tb_board.py does)
uint32_t board_read_core(void* bp, uint32_t addr) {
    Board* b = (Board*)bp;
    b->top->cfg_addr = addr;
    b->run_sync(24);
    return b->top->cfg_data;
}

void board_port_counters(void* bp, int p, uint32_t* out) {
    Board* b = (Board*)bp;
    const auto& c = p == 0 ? b->top->p0_counters : b->top->p1_counters;
    for (int k = 0; k < COUNTERS; ++k) out[k] = c[k];
}

// ticks, sync cycles, core cycles, then per port rx frames, tx frames, tx bad, tx_er,
// tx undelivered, rx dropped; then wall ns simulating
void board_stats(void* bp, uint64_t* o) {
    Board* b = (Board*)bp;
    Stats& s = b->st;
    o[0] = b->tick; o[1] = s.sync_cycles; o[2] = s.core_cycles;
    for (int p = 0; p < NPORTS; ++p) {
        o[3 + 6 * p] = s.rx_frames[p]; o[4 + 6 * p] = s.tx_frames[p];
        o[5 + 6 * p] = s.tx_bad[p]; o[6 + 6 * p] = s.tx_er[p];
        o[7 + 6 * p] = s.tx_undelivered[p]; o[8 + 6 * p] = s.rx_dropped[p];
    }
    o[15] = s.sim_ns;
}

// Serve TAPs for ``seconds`` of wall time: fds[p] is port p's TAP (non-blocking; -1:
// none, what the board sends there is counted as undelivered). Frames read from a TAP
// go into its port; frames the port sends are written to it. The clock runs while a
// frame is queued or on the wire and for ``idle_tail`` sync cycles after the last byte
// either way (the control plane's HMAC and STATUS writer, deadlines); after that the
// board waits in poll() with its clock stopped until a frame arrives. Returns the sync
// cycle count. ``chunk``: sync cycles between looks at the TAPs.
uint64_t board_serve(void* bp, const int* fds, double seconds, uint64_t idle_tail,
                     uint64_t chunk) {
    Board* b = (Board*)bp;
    static uint8_t buf[65536];
    uint64_t start = now_ns(), limit = start + (uint64_t)(seconds * 1e9);
    for (;;) {
        // frames from the TAPs
        for (int p = 0; p < NPORTS; ++p) {
            if (fds[p] < 0) continue;
            for (;;) {
                ssize_t n = read(fds[p], buf, sizeof buf);
                if (n <= 0) break;
                if (b->push(p, buf, (int)n) < 0) ++b->st.rx_dropped[p];
            }
        }
        uint64_t t = now_ns();
        if (t >= limit) break;
        if (!b->busy() && b->idle >= idle_tail) {
            struct pollfd pf[NPORTS];
            int n = 0;
            for (int p = 0; p < NPORTS; ++p)
                if (fds[p] >= 0) { pf[n].fd = fds[p]; pf[n].events = POLLIN; ++n; }
            int ms = (int)((limit - t) / 1000000) + 1;
            poll(pf, n, ms > 50 ? 50 : ms);
            continue;
        }
        b->run_sync(chunk);
        b->st.sim_ns += now_ns() - t;
        for (int p = 0; p < NPORTS; ++p) {
            while (!b->tx[p].out.empty()) {
                std::vector<uint8_t>& f = b->tx[p].out.front();
                if (fds[p] < 0 || write(fds[p], f.data(), f.size()) != (ssize_t)f.size())
                    ++b->st.tx_undelivered[p];
                b->tx[p].out.pop_front();
            }
        }
    }
    return b->st.sync_cycles;
}

}  // extern "C"
