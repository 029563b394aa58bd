/*
 * hpcvm-netguard: anti-spoofing rules for one VM's tap, installed by a narrow helper
 * that runs setuid root (scripts/install-node.sh; docs/site.md "What separates users").
 *
 *   hpcvm-netguard guard   --fd N --mac MAC [--ip IPV4]... [--peer IPV4]...
 *                                                            (N: the caller's tap)
 *   hpcvm-netguard peers   --fd N [--peer IPV4]...           (that tap's peers, anew)
 *   hpcvm-netguard release --fd N                            (drop that tap's rules)
 *   hpcvm-netguard gc                                        (drop rules of gone taps)
 *   hpcvm-netguard init                                      (the table alone; at boot)
 * Root only: --ifname NAME instead of --fd (QEMU made the tap), --config PATH.
 * The config's bridges and ranges bind the other users (root could edit the config);
 * without 'range' lines, the [addresses] pool of /etc/hpcvm/site.toml (where hpcvm's
 * --address auto takes VM addresses from), else the bridge's own subnets, are the ranges;
 * everything else, the node's own MAC and addresses and other VMs' above all, binds
 * root's VMs too.
 *
 * Holding the tap's descriptor proves the caller owns the tap: it must be the tun
 * device's (checked before any ioctl), its tap in this helper's network namespace
 * (TUNGETDEVNETNS), and TUNGETIFF names it.
 * The rules live in one nftables table of the bridge family, `bridge hpcvm_netguard`:
 * a base chain on the bridge's prerouting hook sends each guarded tap's frames (by
 * ifindex, so a stale chain never applies to a new tap of the same name) to its own
 * chain port_IFINDEX, which lets through only the VM's MAC, ARP with its own MAC and
 * addresses (and address probes from 0.0.0.0), IPv4 from its addresses; everything
 * else is counted in named counters (port_IFINDEX_mac, _arp, _ip, _ip6, _other),
 * logged (rate-limited) with the caller's uid, and dropped. A tap no guard covers is
 * dropped whole (counter `unguarded`) unless the admin's config says otherwise, so a
 * user who runs QEMU's bridge helper alone gets a tap that carries nothing.
 * With `job-isolation on` in the config (a site's choice; off by default), each guarded
 * tap's receiving side is filtered too: a base chain on the bridge's forward hook sends
 * the frames leaving through a tap (by output ifindex, map `inports`) to its chain
 * in_IFINDEX, which drops (counter in_IFINDEX_job) IPv4 and ARP whose source lies in
 * the VM ranges (set `vmnets`: the ranges above) unless it is one of that tap's peers
 * (set in_IFINDEX_peers: the same job's VMs, given with --peer); sources outside the
 * VM ranges (nodes, controller, services) pass, and the node's own frames take the
 * output hook, not this one. A caller names the peers of a tap it holds only, so a lie
 * opens its own VM alone.
 * Every change is one nftables transaction; every call first collects the rules of
 * taps that no longer exist (their ifindex is gone: the kernel never reuses one soon).
 *
 * Nothing the caller gives reaches nft as text: the MAC and addresses are parsed and
 * printed again, names are checked against a short alphabet. The environment is
 * cleared. Each refusal is one line on stderr and exit status 2 (usage) or 1 (failure);
 * each change and refusal is logged to syslog (authpriv) with the caller's uid.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <net/if.h>
#include <linux/if_link.h>
#include <linux/if_tun.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netpacket/packet.h>
#include <nftables/libnftables.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <syslog.h>
#include <unistd.h>

#define TABLE "bridge hpcvm_netguard"
#define TABLE_NAME "hpcvm_netguard"
#define DEFAULT_CONFIG "/etc/hpcvm/netguard.conf"
#define SITE_CONFIG "/etc/hpcvm/site.toml" /* [addresses] pool: --address auto's */
#define LOCK_FILE "/run/hpcvm-netguard.lock"
#define MAX_IPS 8
#define MAX_LIST 64
#define MAX_PEERS 1024
#define EXIT_FAIL 1
#define EXIT_USAGE 2

static const char *const REASONS[] = {"mac", "arp", "ip", "ip6", "other"};
#define N_REASONS (sizeof REASONS / sizeof REASONS[0])

struct range {
	struct in_addr net;
	uint32_t mask;
};

struct config {
	char bridges[MAX_LIST][IFNAMSIZ];
	int n_bridges;
	struct range ranges[MAX_LIST];
	int n_ranges;
	bool accept_unguarded;
	bool isolation; /* job-isolation on */
	bool found;
	const char *ranges_from; /* what the ranges are, for a refusal */
};

struct request {
	const char *verb;
	int fd;
	const char *ifname_arg;
	const char *config;
	unsigned char mac[6];
	bool has_mac;
	struct in_addr ips[MAX_IPS];
	int n_ips;
	struct in_addr peers[MAX_PEERS];
	int n_peers;
};

static uid_t caller;

static void refuse(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void refuse(int code, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "hpcvm-netguard: %s\n", line);
	syslog(LOG_WARNING, "uid=%u refused: %s", (unsigned)caller, line);
	exit(code);
}

/* -- values: parsed, never passed on as the caller's text ------------------------- */

static bool parse_mac(const char *text, unsigned char mac[6])
{
	unsigned v[6];
	char tail;
	if (strlen(text) != 17 ||
	    sscanf(text, "%2x:%2x:%2x:%2x:%2x:%2x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
		   &tail) != 6)
		return false;
	for (int i = 0; i < 6; i++) {
		if (text[3 * i + 2] != (i == 5 ? '\0' : ':'))
			return false;
		mac[i] = (unsigned char)v[i];
	}
	return true;
}

static void mac_text(const unsigned char mac[6], char out[18])
{
	snprintf(out, 18, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4],
		 mac[5]);
}

static bool valid_name(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n >= IFNAMSIZ || !strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", name[0]))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-",
			    name[i]))
			return false;
	return true;
}

static bool parse_fd(const char *text, int *fd)
{
	char *end;
	errno = 0;
	long v = strtol(text, &end, 10);
	if (errno || *end || end == text || v < 0 || v > 65535)
		return false;
	*fd = (int)v;
	return true;
}

static bool parse_range(const char *text, struct range *r)
{
	char buf[32];
	char *slash, *end;
	if (strlen(text) >= sizeof buf)
		return false;
	strcpy(buf, text);
	slash = strchr(buf, '/');
	if (!slash)
		return false;
	*slash = '\0';
	long len = strtol(slash + 1, &end, 10);
	if (*end || end == slash + 1 || len < 0 || len > 32 || inet_pton(AF_INET, buf, &r->net) != 1)
		return false;
	r->mask = len == 0 ? 0 : htonl(~0u << (32 - len));
	r->net.s_addr &= r->mask;
	return true;
}

static bool in_range(const struct range *r, struct in_addr ip)
{
	return (ip.s_addr & r->mask) == r->net.s_addr;
}

/* -- arguments ------------------------------------------------------------------- */

static void usage_line(void)
{
	refuse(EXIT_USAGE, "usage: hpcvm-netguard guard --fd N --mac MAC [--ip IPV4]... "
			   "[--peer IPV4]... | peers --fd N [--peer IPV4]... | release --fd N | gc | "
			   "init");
}

/* A peer: a unicast IPv4 address (one given twice counts once). */
static void add_peer(struct request *req, const char *val)
{
	struct in_addr ip;
	if (inet_pton(AF_INET, val, &ip) != 1)
		refuse(EXIT_USAGE, "--peer '%.32s' is not an IPv4 address", val);
	if (ip.s_addr == 0 || (ntohl(ip.s_addr) >> 28) >= 14)
		refuse(EXIT_USAGE, "--peer %.32s is not a unicast address", val);
	for (int j = 0; j < req->n_peers; j++)
		if (req->peers[j].s_addr == ip.s_addr)
			return;
	if (req->n_peers == MAX_PEERS)
		refuse(EXIT_USAGE, "at most %d --peer per tap", MAX_PEERS);
	req->peers[req->n_peers++] = ip;
}

static void parse_args(int argc, char **argv, struct request *req)
{
	memset(req, 0, sizeof *req);
	req->fd = -1;
	if (argc < 2)
		usage_line();
	req->verb = argv[1];
	if (strcmp(req->verb, "guard") && strcmp(req->verb, "peers") &&
	    strcmp(req->verb, "release") && strcmp(req->verb, "gc") && strcmp(req->verb, "init"))
		refuse(EXIT_USAGE, "unknown verb '%.32s': use guard, peers, release, gc or init",
		       req->verb);
	for (int i = 2; i < argc; i += 2) {
		const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (!val)
			refuse(EXIT_USAGE, "%.32s needs a value", opt);
		if (!strcmp(opt, "--fd")) {
			if (!parse_fd(val, &req->fd))
				refuse(EXIT_USAGE, "--fd '%.32s' is not a descriptor number", val);
		} else if (!strcmp(opt, "--ifname") || !strcmp(opt, "--config")) {
			if (caller != 0)
				refuse(EXIT_USAGE, "%s is for root only: give the tap's descriptor with --fd",
				       opt);
			if (!strcmp(opt, "--config"))
				req->config = val;
			else if (!valid_name(val))
				refuse(EXIT_USAGE, "--ifname '%.32s' is not an interface name", val);
			else
				req->ifname_arg = val;
		} else if (!strcmp(opt, "--mac")) {
			if (!parse_mac(val, req->mac))
				refuse(EXIT_USAGE, "--mac '%.32s' is not a MAC (xx:xx:xx:xx:xx:xx)", val);
			req->has_mac = true;
		} else if (!strcmp(opt, "--ip")) {
			if (req->n_ips == MAX_IPS)
				refuse(EXIT_USAGE, "at most %d --ip per tap", MAX_IPS);
			if (inet_pton(AF_INET, val, &req->ips[req->n_ips]) != 1)
				refuse(EXIT_USAGE, "--ip '%.32s' is not an IPv4 address", val);
			for (int j = 0; j < req->n_ips; j++)
				if (req->ips[j].s_addr == req->ips[req->n_ips].s_addr)
					refuse(EXIT_USAGE, "--ip %.32s is given twice", val);
			if (req->ips[req->n_ips].s_addr == 0 || (ntohl(req->ips[req->n_ips].s_addr) >> 28) >= 14)
				refuse(EXIT_USAGE, "--ip %.32s is not a unicast address", val);
			req->n_ips++;
		} else if (!strcmp(opt, "--peer")) {
			add_peer(req, val);
		} else {
			refuse(EXIT_USAGE, "unknown option '%.32s'", opt);
		}
	}
	bool peers = !strcmp(req->verb, "peers");
	bool tapped = !strcmp(req->verb, "guard") || !strcmp(req->verb, "release") || peers;
	if (tapped && (req->fd < 0) == (req->ifname_arg == NULL))
		refuse(EXIT_USAGE, "%s needs the tap: --fd N (or, as root, --ifname NAME)", req->verb);
	if (!tapped && (req->fd >= 0 || req->ifname_arg || req->has_mac || req->n_ips ||
			req->n_peers))
		refuse(EXIT_USAGE, "%s takes no tap, MAC or address", req->verb);
	if (peers && (req->has_mac || req->n_ips))
		refuse(EXIT_USAGE, "peers takes only the tap and --peer");
	if (!strcmp(req->verb, "guard") && !req->has_mac)
		refuse(EXIT_USAGE, "guard needs --mac: the VM's MAC");
	if (!strcmp(req->verb, "release") && (req->has_mac || req->n_ips || req->n_peers))
		refuse(EXIT_USAGE, "release takes only the tap");
}

/* -- the admin's config ------------------------------------------------------------ */

/* A root-owned file only root may write, open for reading; NULL when there is none. */
static FILE *open_admins(const char *path)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return NULL;
		refuse(EXIT_FAIL, "cannot read %s: %s", path, strerror(errno));
	}
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022))
		refuse(EXIT_FAIL, "%s must be a file owned by root and writable by root alone: "
				  "an admin fixes it (chown root:root, chmod 644)", path);
	FILE *f = fdopen(fd, "r");
	if (!f)
		refuse(EXIT_FAIL, "cannot read %s: %s", path, strerror(errno));
	return f;
}

/* Without 'range' lines, the pool hpcvm's --address auto takes VM addresses from
 * (site.toml's `pool = "CIDR"` in [addresses], as cluster/addresses.py reads it). */
static void read_site_pool(const char *path, struct config *cfg)
{
	FILE *f = open_admins(path);
	char line[256], cidr[64];
	bool addresses = false;
	while (f && fgets(line, sizeof line, f)) {
		char *p = line + strspn(line, " \t");
		if (*p == '[')
			addresses = !strncmp(p, "[addresses]", 11);
		else if (addresses && sscanf(p, "pool = \"%63[0-9./]\"", cidr) == 1 &&
			 parse_range(cidr, &cfg->ranges[0])) {
			cfg->n_ranges = 1;
			cfg->ranges_from = "the [addresses] pool of " SITE_CONFIG;
		}
	}
	if (f)
		fclose(f);
}

static void read_config(const char *path, struct config *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	FILE *f = open_admins(path);
	if (!f)
		return;
	char line[256], key[32], val[64];
	int lineno = 0;
	cfg->found = true;
	while (f && fgets(line, sizeof line, f)) {
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		int n = sscanf(line, "%31s %63s", key, val);
		if (n <= 0)
			continue;
		if (n == 2 && !strcmp(key, "bridge") && valid_name(val) && cfg->n_bridges < MAX_LIST)
			strcpy(cfg->bridges[cfg->n_bridges++], val);
		else if (n == 2 && !strcmp(key, "range") && cfg->n_ranges < MAX_LIST &&
			 parse_range(val, &cfg->ranges[cfg->n_ranges]))
			cfg->n_ranges++;
		else if (n == 2 && !strcmp(key, "unguarded-taps") &&
			 (!strcmp(val, "drop") || !strcmp(val, "accept")))
			cfg->accept_unguarded = !strcmp(val, "accept");
		else if (n == 2 && !strcmp(key, "job-isolation") &&
			 (!strcmp(val, "on") || !strcmp(val, "off")))
			cfg->isolation = !strcmp(val, "on");
		else
			refuse(EXIT_FAIL, "%s line %d is not 'bridge NAME', 'range A.B.C.D/N', "
					  "'unguarded-taps drop|accept' or 'job-isolation on|off': an "
					  "admin fixes it", path, lineno);
	}
	if (f)
		fclose(f);
}

/* -- the tap and the node (netlink, getifaddrs) ------------------------------------ */

/* The master (a bridge's ifindex, 0: none) and kind ("tun", "bridge", ...) of a link. */
static bool link_info(int ifindex, int *master, char kind[32])
{
	struct {
		struct nlmsghdr nh;
		struct ifinfomsg ifi;
	} req = {.nh = {.nlmsg_len = sizeof req, .nlmsg_type = RTM_GETLINK,
			.nlmsg_flags = NLM_F_REQUEST},
		 .ifi = {.ifi_family = AF_UNSPEC, .ifi_index = ifindex}};
	char buf[16384];
	int sock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	*master = 0;
	kind[0] = '\0';
	if (sock < 0 || send(sock, &req, sizeof req, 0) < 0) {
		if (sock >= 0)
			close(sock);
		return false;
	}
	ssize_t len = recv(sock, buf, sizeof buf, 0);
	close(sock);
	struct nlmsghdr *nh = (struct nlmsghdr *)buf;
	if (len <= 0 || !NLMSG_OK(nh, (size_t)len) || nh->nlmsg_type != RTM_NEWLINK)
		return false;
	struct ifinfomsg *ifi = NLMSG_DATA(nh);
	int alen = (int)IFLA_PAYLOAD(nh);
	for (struct rtattr *a = IFLA_RTA(ifi); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
		if (a->rta_type == IFLA_MASTER && RTA_PAYLOAD(a) >= 4)
			memcpy(master, RTA_DATA(a), 4);
		if (a->rta_type != IFLA_LINKINFO)
			continue;
		int ilen = (int)RTA_PAYLOAD(a);
		for (struct rtattr *b = RTA_DATA(a); RTA_OK(b, ilen); b = RTA_NEXT(b, ilen))
			if (b->rta_type == IFLA_INFO_KIND)
				snprintf(kind, 32, "%.*s", (int)RTA_PAYLOAD(b), (char *)RTA_DATA(b));
	}
	return true;
}

struct tap {
	char name[IFNAMSIZ];
	int index;
	char bridge[IFNAMSIZ];
};

static void find_tap(const struct request *req, struct tap *tap)
{
	memset(tap, 0, sizeof *tap);
	if (req->fd >= 0) {
		struct ifreq ifr = {0};
		struct stat st, mine, theirs;
		/* No ioctl as root on a descriptor before it is known to be the tun device's
		 * (misc 10:200): on another file the same number could mean something else. */
		if (fstat(req->fd, &st) < 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != 10 ||
		    minor(st.st_rdev) != 200 || ioctl(req->fd, TUNGETIFF, &ifr) < 0)
			refuse(EXIT_USAGE, "descriptor %d is not a tap: give the descriptor QEMU's "
					   "bridge helper returned", req->fd);
		if (!(ifr.ifr_flags & IFF_TAP))
			refuse(EXIT_USAGE, "descriptor %d is a tun, not a tap", req->fd);
		snprintf(tap->name, IFNAMSIZ, "%s", ifr.ifr_name);
		/* The name is looked up in this network namespace: the tap must be in it (a
		 * user's own namespace may hold a tap named like another user's here). */
		int ns = ioctl(req->fd, TUNGETDEVNETNS);
		if (ns < 0 || fstat(ns, &theirs) < 0 || stat("/proc/self/ns/net", &mine) < 0 ||
		    theirs.st_ino != mine.st_ino || theirs.st_dev != mine.st_dev)
			refuse(EXIT_USAGE, "tap %s is not in this helper's network namespace: run it "
					   "where the tap is", tap->name);
		close(ns);
	} else {
		snprintf(tap->name, IFNAMSIZ, "%s", req->ifname_arg);
	}
	if (!valid_name(tap->name))
		refuse(EXIT_USAGE, "the tap's name is not one this helper handles");
	tap->index = (int)if_nametoindex(tap->name);
	int master;
	char kind[32];
	if (!tap->index || !link_info(tap->index, &master, kind))
		refuse(EXIT_USAGE, "no interface %s in this network namespace", tap->name);
	if (strcmp(kind, "tun"))
		refuse(EXIT_USAGE, "%s is not a tap (its kind is '%s')", tap->name, kind);
	if (!strcmp(req->verb, "release") || !strcmp(req->verb, "peers"))
		return;
	char mkind[32];
	int unused;
	if (!master || !if_indextoname((unsigned)master, tap->bridge) ||
	    !link_info(master, &unused, mkind) || strcmp(mkind, "bridge"))
		refuse(EXIT_USAGE, "tap %s is in no bridge: put it in one first", tap->name);
}

/* Refuse a MAC or address the node itself has on any of its interfaces. */
static void check_not_node(const struct request *req)
{
	struct ifaddrs *all, *a;
	char text[18];
	if (getifaddrs(&all) < 0)
		refuse(EXIT_FAIL, "cannot read the node's addresses: %s", strerror(errno));
	for (a = all; a; a = a->ifa_next) {
		if (!a->ifa_addr)
			continue;
		if (a->ifa_addr->sa_family == AF_PACKET) {
			struct sockaddr_ll *ll = (struct sockaddr_ll *)a->ifa_addr;
			if (ll->sll_halen == 6 && !memcmp(ll->sll_addr, req->mac, 6)) {
				mac_text(req->mac, text);
				refuse(EXIT_USAGE, "MAC %s is the node's own (%s)", text, a->ifa_name);
			}
		} else if (a->ifa_addr->sa_family == AF_INET) {
			struct in_addr own = ((struct sockaddr_in *)a->ifa_addr)->sin_addr;
			for (int i = 0; i < req->n_ips; i++)
				if (own.s_addr == req->ips[i].s_addr)
					refuse(EXIT_USAGE, "address %s is the node's own (%s)",
					       inet_ntoa(own), a->ifa_name);
		}
	}
	freeifaddrs(all);
}

/* The ranges a VM's address must lie in: the admin's, else the bridge's own subnets. */
static void check_ranges(const struct request *req, const struct config *cfg, const char *bridge)
{
	struct range found[MAX_LIST];
	const struct range *ranges = cfg->ranges;
	int n = cfg->n_ranges;
	const char *from = cfg->ranges_from ? cfg->ranges_from : "'range' lines of " DEFAULT_CONFIG;
	if (cfg->n_ranges == 0) {
		from = "no range set: the bridge's own subnets";
		struct ifaddrs *all, *a;
		n = 0;
		if (getifaddrs(&all) < 0)
			refuse(EXIT_FAIL, "cannot read the node's addresses: %s", strerror(errno));
		for (a = all; a && n < MAX_LIST; a = a->ifa_next)
			if (a->ifa_addr && a->ifa_netmask && a->ifa_addr->sa_family == AF_INET &&
			    !strcmp(a->ifa_name, bridge)) {
				found[n].mask = ((struct sockaddr_in *)a->ifa_netmask)->sin_addr.s_addr;
				found[n].net.s_addr =
				    ((struct sockaddr_in *)a->ifa_addr)->sin_addr.s_addr & found[n].mask;
				n++;
			}
		freeifaddrs(all);
		ranges = found;
	}
	for (int i = 0; i < req->n_ips; i++) {
		bool ok = false;
		for (int j = 0; j < n && !ok; j++)
			ok = in_range(&ranges[j], req->ips[i]);
		if (!ok)
			refuse(EXIT_USAGE, "address %s is outside the ranges the admin allows on %s "
					   "(%s): an admin adds 'range CIDR' to " DEFAULT_CONFIG,
			       inet_ntoa(req->ips[i]), bridge, from);
	}
}

static void check_bridge(const struct config *cfg, const char *bridge)
{
	if (!cfg->found || cfg->n_bridges == 0)
		return;
	for (int i = 0; i < cfg->n_bridges; i++)
		if (!strcmp(cfg->bridges[i], bridge))
			return;
	refuse(EXIT_USAGE, "bridge %s is not one the admin allows: an admin adds 'bridge %s' to %s",
	       bridge, bridge, DEFAULT_CONFIG);
}

/* -- nftables ---------------------------------------------------------------------- */

struct cmd {
	char *text;
	size_t len, cap;
};

static void add(struct cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct cmd *c, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int n = vsnprintf(c->text ? c->text + c->len : NULL, c->text ? c->cap - c->len : 0,
				  fmt, ap);
		va_end(ap);
		if (n < 0)
			refuse(EXIT_FAIL, "cannot build the rules");
		if (c->text && c->len + (size_t)n + 1 <= c->cap) {
			c->len += (size_t)n;
			return;
		}
		c->cap = (c->cap + (size_t)n + 1) * 2;
		c->text = realloc(c->text, c->cap);
		if (!c->text)
			refuse(EXIT_FAIL, "out of memory");
		if (c->len == 0)
			c->text[0] = '\0';
	}
}

static struct nft_ctx *nft;

static void nft_open(void)
{
	nft = nft_ctx_new(NFT_CTX_DEFAULT);
	if (!nft)
		refuse(EXIT_FAIL, "cannot start libnftables");
	nft_ctx_buffer_output(nft);
	nft_ctx_buffer_error(nft);
}

/* One transaction: all of it or none of it. */
static void nft_run(const char *text)
{
	if (nft_run_cmd_from_buffer(nft, text) != 0) {
		const char *err = nft_ctx_get_error_buffer(nft);
		char first[256] = "";
		if (err)
			sscanf(err, "%255[^\n]", first);
		refuse(EXIT_FAIL, "nftables refused the rules: %s", first);
	}
}

static json_t *nft_list(void)
{
	nft_ctx_output_set_flags(nft, NFT_CTX_OUTPUT_JSON);
	int rc = nft_run_cmd_from_buffer(nft, "list table " TABLE);
	nft_ctx_output_set_flags(nft, 0);
	if (rc != 0)
		refuse(EXIT_FAIL, "cannot list table %s", TABLE);
	json_t *root = json_loads(nft_ctx_get_output_buffer(nft), 0, NULL);
	json_t *items = root ? json_object_get(root, "nftables") : NULL;
	if (!json_is_array(items))
		refuse(EXIT_FAIL, "cannot read table %s", TABLE);
	json_incref(items);
	json_decref(root);
	return items;
}

static void range_text(const struct range *r, char out[32])
{
	uint32_t m = ntohl(r->mask);
	int len = 0;
	while (m & 0x80000000u) {
		len++;
		m <<= 1;
	}
	snprintf(out, 32, "%s/%d", inet_ntoa(r->net), len);
}

/* Job isolation's shared part: the VM ranges and the forward hook's dispatch by output
 * port (made only when the setting is on; switched off, main flushes the dispatch). */
static void isolation_base(struct cmd *c, const struct config *cfg)
{
	char text[32];
	add(c, "add set " TABLE " vmnets { type ipv4_addr; flags interval; auto-merge; }\n");
	add(c, "flush set " TABLE " vmnets\n");
	for (int i = 0; i < cfg->n_ranges; i++) {
		range_text(&cfg->ranges[i], text);
		add(c, "add element " TABLE " vmnets { %s }\n", text);
	}
	add(c, "add map " TABLE " inports { type iface_index : verdict; }\n");
	add(c, "add chain " TABLE " forward { type filter hook forward priority -300; "
	       "policy accept; }\n");
	add(c, "flush chain " TABLE " forward\n");
	add(c, "add rule " TABLE " forward oif vmap @inports\n");
}

static void base(struct cmd *c, const struct config *cfg)
{
	bool accept_unguarded = cfg->accept_unguarded;
	add(c, "add table " TABLE "\n");
	add(c, "add map " TABLE " ports { type iface_index : verdict; }\n");
	add(c, "add map " TABLE " macs { type ether_addr : iface_index; }\n");
	add(c, "add map " TABLE " addrs { type ipv4_addr : iface_index; }\n");
	add(c, "add counter " TABLE " unguarded\n");
	add(c, "add chain " TABLE " prerouting { type filter hook prerouting priority -300; "
	       "policy accept; }\n");
	add(c, "flush chain " TABLE " prerouting\n");
	add(c, "add rule " TABLE " prerouting iif vmap @ports\n");
	if (!accept_unguarded)
		add(c, "add rule " TABLE " prerouting meta iifkind \"tun\" counter name unguarded "
		       "drop\n");
	if (cfg->isolation)
		isolation_base(c, cfg);
}

/* An element value or chain suffix that names a live interface (nft prints a live
 * iface_index as its name, a gone one as its number). */
static bool value_live(const char *v, int *index)
{
	char *end;
	long n = strtol(v, &end, 10);
	if (*v && !*end) {
		char name[IF_NAMESIZE];
		*index = (int)n;
		return n > 0 && if_indextoname((unsigned)n, name) != NULL;
	}
	*index = (int)if_nametoindex(v);
	return *index > 0;
}

/* The tap's ifindex an object's name holds (port_IFINDEX[_...], in_IFINDEX[_...]), or 0. */
static int object_index(const char *name)
{
	int index = 0;
	if (!strncmp(name, "port_", 5) && sscanf(name + 5, "%d", &index) == 1)
		return index;
	if (!strncmp(name, "in_", 3) && sscanf(name + 3, "%d", &index) == 1)
		return index;
	return 0;
}

/* An element's key or value as text (nft gives numbers for gone interfaces). */
static const char *elem_text(json_t *v, char buf[32])
{
	if (json_is_integer(v)) {
		snprintf(buf, 32, "%lld", (long long)json_integer_value(v));
		return buf;
	}
	return json_string_value(v);
}

/* Commands that remove the map elements of gone taps and, with `mine` > 0, of that tap
 * (first pass), then their chains and counters (second pass). */
static int collect(struct cmd *c, json_t *items, int mine)
{
	size_t i, j;
	json_t *item, *e;
	int dropped = 0;
	json_array_foreach(items, i, item) {
		json_t *map = json_object_get(item, "map");
		const char *mname = map ? json_string_value(json_object_get(map, "name")) : NULL;
		if (!mname || (strcmp(mname, "ports") && strcmp(mname, "inports") &&
			       strcmp(mname, "macs") && strcmp(mname, "addrs")))
			continue;
		bool ports = !strcmp(mname, "ports") || !strcmp(mname, "inports");
		json_array_foreach(json_object_get(map, "elem"), j, e) {
			char kbuf[32], vbuf[32];
			const char *k = elem_text(json_array_get(e, 0), kbuf);
			const char *v = ports ? k : elem_text(json_array_get(e, 1), vbuf);
			int index = 0;
			if (!k || !v || (value_live(v, &index) && index != mine))
				continue;
			if (ports)
				add(c, "delete element " TABLE " %s { %d }\n", mname, index);
			else
				add(c, "delete element " TABLE " %s { %s }\n", mname, k);
		}
	}
	/* then chains (their rules name the sets and counters), sets, counters */
	static const char *const kinds[] = {"chain", "set", "counter"};
	for (size_t k = 0; k < 3; k++) {
		json_array_foreach(items, i, item) {
			json_t *obj = json_object_get(item, kinds[k]);
			const char *name = obj ? json_string_value(json_object_get(obj, "name")) : NULL;
			int index = name ? object_index(name) : 0, live;
			char digits[16];
			snprintf(digits, sizeof digits, "%d", index);
			if (index <= 0 || (index != mine && value_live(digits, &live)))
				continue;
			add(c, "delete %s " TABLE " %s\n", kinds[k], name);
			dropped += k == 0 && !strncmp(name, "port_", 5);
		}
	}
	return dropped;
}

/* Refuse a MAC or address another live guarded tap holds (from the maps). */
static void check_not_taken(json_t *items, const struct request *req, const struct tap *tap)
{
	size_t i, j;
	json_t *item, *e;
	char mac[18];
	mac_text(req->mac, mac);
	json_array_foreach(items, i, item) {
		json_t *map = json_object_get(item, "map");
		const char *mname = map ? json_string_value(json_object_get(map, "name")) : NULL;
		if (!mname || (strcmp(mname, "macs") && strcmp(mname, "addrs")))
			continue;
		json_array_foreach(json_object_get(map, "elem"), j, e) {
			const char *k = json_string_value(json_array_get(e, 0));
			const char *v = json_string_value(json_array_get(e, 1));
			int index;
			if (!k || !v || !value_live(v, &index) || index == tap->index)
				continue;
			if (!strcmp(mname, "macs") && !strcmp(k, mac))
				refuse(EXIT_USAGE, "MAC %s is already another VM's (tap %s)", mac, v);
			for (int n = 0; !strcmp(mname, "addrs") && n < req->n_ips; n++)
				if (!strcmp(k, inet_ntoa(req->ips[n])))
					refuse(EXIT_USAGE, "address %s is already another VM's (tap %s)", k, v);
		}
	}
}

/* A drop: logged (at most 6 a minute per reason and tap), counted, dropped. */
static void drop_rule(struct cmd *c, int index, const char *match, const char *reason,
		      const char *tap)
{
	add(c, "add rule " TABLE " port_%d %s limit rate 6/minute log prefix \"hpcvm-netguard "
	       "uid=%u %s %s: \"\n", index, match, (unsigned)caller, tap, reason);
	add(c, "add rule " TABLE " port_%d %s counter name port_%d_%s drop\n", index, match, index,
	    reason);
}

static void port_rules(struct cmd *c, const struct request *req, const struct tap *tap)
{
	char mac[18], ips[MAX_IPS * 17 + 4] = "", arp[] = "arp htype 1 arp ptype ip arp hlen 6 "
							  "arp plen 4";
	int x = tap->index;
	mac_text(req->mac, mac);
	for (int i = 0; i < req->n_ips; i++) {
		strcat(ips, i ? ", " : "{ ");
		strcat(ips, inet_ntoa(req->ips[i]));
	}
	if (req->n_ips)
		strcat(ips, " }");
	add(c, "add chain " TABLE " port_%d { comment \"%s in %s: uid %u, mac %s, ipv4 %s\"; }\n", x,
	    tap->name, tap->bridge, (unsigned)caller, mac, req->n_ips ? ips : "none");
	add(c, "flush chain " TABLE " port_%d\n", x);
	for (size_t r = 0; r < N_REASONS; r++)
		add(c, "add counter " TABLE " port_%d_%s\n", x, REASONS[r]);
	char match[64];
	snprintf(match, sizeof match, "ether saddr != %s", mac);
	drop_rule(c, x, match, "mac", tap->name);
	if (req->n_ips)
		add(c, "add rule " TABLE " port_%d ether type arp %s arp saddr ether %s arp saddr ip "
		       "%s accept\n", x, arp, mac, ips);
	add(c, "add rule " TABLE " port_%d ether type arp %s arp operation request arp saddr "
	       "ether %s arp saddr ip 0.0.0.0 accept\n", x, arp, mac);
	drop_rule(c, x, "ether type arp", "arp", tap->name);
	if (req->n_ips)
		add(c, "add rule " TABLE " port_%d ether type ip ip saddr %s accept\n", x, ips);
	drop_rule(c, x, "ether type ip", "ip", tap->name);
	drop_rule(c, x, "ether type ip6", "ip6", tap->name);
	drop_rule(c, x, "", "other", tap->name);
	add(c, "add element " TABLE " ports { %d : jump port_%d }\n", x, x);
	add(c, "add element " TABLE " macs { %s : %d }\n", mac, x);
	for (int i = 0; i < req->n_ips; i++)
		add(c, "add element " TABLE " addrs { %s : %d }\n", inet_ntoa(req->ips[i]), x);
}

/* The peers of tap `x` as its set's elements (none: an empty set). */
static void peer_elements(struct cmd *c, const struct request *req, int x)
{
	add(c, "flush set " TABLE " in_%d_peers\n", x);
	for (int i = 0; i < req->n_peers; i++)
		add(c, "add element " TABLE " in_%d_peers { %s }\n", x, inet_ntoa(req->peers[i]));
}

/* Job isolation on tap `x`'s receiving side (the file's header). */
static void in_rules(struct cmd *c, const struct request *req, const struct tap *tap)
{
	int x = tap->index;
	add(c, "add set " TABLE " in_%d_peers { type ipv4_addr; comment \"peers of %s\"; }\n", x,
	    tap->name);
	peer_elements(c, req, x);
	add(c, "add counter " TABLE " in_%d_job\n", x);
	add(c, "add chain " TABLE " in_%d { comment \"to %s: uid %u; its peers: set in_%d_peers\"; "
	       "}\n", x, tap->name, (unsigned)caller, x);
	add(c, "flush chain " TABLE " in_%d\n", x);
	static const char *const kinds[][2] = {{"arp", "arp saddr ip"}, {"ip", "ip saddr"}};
	for (size_t k = 0; k < 2; k++) {
		const char *t = kinds[k][0], *src = kinds[k][1];
		add(c, "add rule " TABLE " in_%d ether type %s %s @in_%d_peers accept\n", x, t, src, x);
		add(c, "add rule " TABLE " in_%d ether type %s %s @vmnets limit rate 6/minute log "
		       "prefix \"hpcvm-netguard uid=%u %s job: \"\n", x, t, src, (unsigned)caller,
		    tap->name);
		add(c, "add rule " TABLE " in_%d ether type %s %s @vmnets counter name in_%d_job "
		       "drop\n", x, t, src, x);
	}
	add(c, "add element " TABLE " inports { %d : jump in_%d }\n", x, x);
}

/* Whether the listing holds an object of `kind` named `name`. */
static bool listed(json_t *items, const char *kind, const char *name)
{
	size_t i;
	json_t *item;
	json_array_foreach(items, i, item) {
		json_t *obj = json_object_get(item, kind);
		const char *n = obj ? json_string_value(json_object_get(obj, "name")) : NULL;
		if (n && !strcmp(n, name))
			return true;
	}
	return false;
}

/* -- main -------------------------------------------------------------------------- */

static int lock_all(void)
{
	int fd = open(LOCK_FILE, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_EX) < 0)
		refuse(EXIT_FAIL, "cannot lock %s: %s", LOCK_FILE, strerror(errno));
	return fd;
}

int main(int argc, char **argv)
{
	struct request req;
	struct config cfg;
	struct tap tap = {0};
	struct cmd c = {0};
	caller = getuid();
	clearenv();
	umask(077);
	openlog("hpcvm-netguard", LOG_PID, LOG_AUTHPRIV);
	if (geteuid() != 0)
		refuse(EXIT_FAIL, "not running as root: an admin installs it setuid root "
				  "(scripts/install-node.sh; docs/site.md)");
	if (setuid(0) < 0) /* libnftables checks nothing, but the kernel wants CAP_NET_ADMIN */
		refuse(EXIT_FAIL, "cannot become root: %s", strerror(errno));
	parse_args(argc, argv, &req);
	read_config(req.config ? req.config : DEFAULT_CONFIG, &cfg);
	if (cfg.isolation && cfg.n_ranges == 0)
		read_site_pool(SITE_CONFIG, &cfg);
	if (cfg.isolation && cfg.n_ranges == 0)
		refuse(EXIT_FAIL, "job-isolation on needs the VMs' ranges: an admin adds 'range "
				  "CIDR' to %s (or [addresses] pool to " SITE_CONFIG ")",
		       req.config ? req.config : DEFAULT_CONFIG);
	if (req.fd >= 0 || req.ifname_arg)
		find_tap(&req, &tap);
	if (!strcmp(req.verb, "guard")) {
		if (req.mac[0] & 1 || !memcmp(req.mac, "\0\0\0\0\0\0", 6))
			refuse(EXIT_USAGE, "--mac must be a unicast MAC that is not all zero");
		if (caller != 0) { /* the admin's allow-lists bind users; root could edit them */
			check_bridge(&cfg, tap.bridge);
			if (cfg.n_ranges == 0)
				read_site_pool(SITE_CONFIG, &cfg);
			check_ranges(&req, &cfg, tap.bridge);
		}
		check_not_node(&req);
	}
	lock_all();
	nft_open();
	base(&c, &cfg);
	nft_run(c.text);
	json_t *items = nft_list();
	if (!strcmp(req.verb, "guard"))
		check_not_taken(items, &req, &tap);
	c.len = 0;
	c.text[0] = '\0';
	int mine = strcmp(req.verb, "guard") && strcmp(req.verb, "release") ? 0 : tap.index;
	int dropped = collect(&c, items, mine);
	if (!cfg.isolation && listed(items, "chain", "forward"))
		add(&c, "flush chain " TABLE " forward\n"); /* switched off: no tap isolated */
	if (!strcmp(req.verb, "guard"))
		port_rules(&c, &req, &tap);
	if (!strcmp(req.verb, "guard") && cfg.isolation)
		in_rules(&c, &req, &tap);
	if (!strcmp(req.verb, "peers") && cfg.isolation) {
		char chain[32];
		snprintf(chain, sizeof chain, "in_%d", tap.index);
		if (!listed(items, "chain", chain))
			refuse(EXIT_USAGE, "tap %s has no job isolation: guard it first (its peers "
					   "are set with its guard)", tap.name);
		peer_elements(&c, &req, tap.index);
	}
	if (c.len)
		nft_run(c.text);
	if (!strcmp(req.verb, "peers")) {
		syslog(LOG_NOTICE, "uid=%u peers %s (ifindex %d): %d peer(s)%s", (unsigned)caller,
		       tap.name, tap.index, req.n_peers, cfg.isolation ? "" : ", job isolation off");
	} else if (!strcmp(req.verb, "guard")) {
		char mac[18];
		mac_text(req.mac, mac);
		syslog(LOG_NOTICE, "uid=%u guard %s (ifindex %d) in %s: mac %s, %d ipv4 address(es), "
		       "%s", (unsigned)caller, tap.name, tap.index, tap.bridge, mac, req.n_ips,
		       cfg.isolation ? "job isolation on" : "job isolation off");
	} else if (dropped || !strcmp(req.verb, "release")) {
		syslog(LOG_NOTICE, "uid=%u %s: removed the rules of %d tap(s)", (unsigned)caller,
		       req.verb, dropped);
	}
	json_decref(items);
	nft_ctx_free(nft);
	free(c.text);
	return 0;
}
