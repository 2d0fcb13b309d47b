/* Sending in runs with UDP generic segmentation offload, shared by the worker's call
 * loop (_client.c) and the switch's fast engine (host/switch/_engine.c); why, and the
 * measurements: docs/congestion.md, "Sending in runs".
 *
 * A run is consecutive datagrams of one length (the last may be shorter) to one
 * destination, sent as one message with a UDP_SEGMENT control message: the kernel cuts
 * it into those datagrams as late as it can, so the socket, a qdisc, a veth and a
 * bridge are passed once per run, not once per datagram. The receiver gets the same
 * datagrams. */
#ifndef GSO_RUNS_H
#define GSO_RUNS_H

#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103          /* linux/udp.h (Linux 4.18 and later) */
#endif
#define GSO_MAX_BYTES 65000      /* one GSO send: an IPv4 datagram's 64 KB, less headers */

/* the control message of one run */
typedef union { char buf[CMSG_SPACE(sizeof(uint16_t))]; struct cmsghdr align; } GsoCtl;

/* How many datagrams from iov[i] (before iov[end]) one send carries: those of iov[i]'s
 * length, a shorter one ending the run, at most max_segs and GSO_MAX_BYTES in all, and
 * with ``addr`` (NULL: one destination) the same destination as iov[i]'s. */
static inline int gso_run(const struct iovec *iov, const struct sockaddr_in *addr, int i,
                          int end, int max_segs) {
    size_t len = iov[i].iov_len, tot = len;
    int n = 1;
    while (i + n < end && n < max_segs && iov[i + n].iov_len <= len &&
           tot + iov[i + n].iov_len <= GSO_MAX_BYTES &&
           (!addr || (addr[i + n].sin_addr.s_addr == addr[i].sin_addr.s_addr &&
                      addr[i + n].sin_port == addr[i].sin_port))) {
        tot += iov[i + n].iov_len;
        if (iov[i + n++].iov_len < len) break;
    }
    return n;
}

/* Make ``h`` (whose iovecs are the run, one datagram each) one send cut every ``seg``
 * bytes. */
static inline void gso_mark(struct msghdr *h, GsoCtl *ctl, size_t seg) {
    h->msg_control = ctl->buf;
    h->msg_controllen = sizeof ctl->buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(h);
    cm->cmsg_level = IPPROTO_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t s = (uint16_t)seg;
    memcpy(CMSG_DATA(cm), &s, sizeof s);
}

/* errno of a send that this kernel or device cannot segment: send one by one */
static inline int gso_refused(int err) {
    return err == EINVAL || err == EIO || err == ENOPROTOOPT;
}

#endif
