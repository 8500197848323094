package main

// factDef is one RouterOS fact the driver relies on, as docs/routeros.md
// lists it ("Facts the driver relies on"); the self-test prints one line
// for each, under its id.
type factDef struct {
	id, fact string
	// unmeasured, when set, is why the self-test never measures it.
	unmeasured string
}

// selftestFacts: the order is the report's. TestFactsTableMatchesSelftest
// keeps docs/routeros.md's table and this list the same.
var selftestFacts = []factDef{
	{id: "resource-print", fact: "/system resource print prints version and board-name as `key: value` lines"},
	{id: "pool-capacity", fact: "/disk print detail where mount-point=<pool> prints the pool's size= and free="},
	{id: "exit-status", fact: "a refused command exits with status 0 and says why in its text",
		unmeasured: "not visible through the client, which classifies a refusal by its text whatever the status"},
	{id: "silent-success", fact: "add, set and remove print nothing when they succeed"},
	{id: "login-width", fact: "the login name's width option (user+ct511w4098h) widens print output in exec sessions"},
	{id: "wrap-rejoin", fact: "values broken across lines (at or before the width) are read back whole"},
	{id: "flag-columns", fact: "a listing prints flags in fixed columns, one per letter of its Flags: legend, blank where unset"},
	{id: "legend-used", fact: "a listing's Flags: legend names only the flags its entries carry"},
	{id: "legend-empty", fact: "a print that matches nothing prints the Flags: legend alone"},
	{id: "size-suffix", fact: "file-size= takes binary M and G suffixes (65M is 68157440 bytes)"},
	{id: "size-print", fact: "size= prints the exact byte count in space-separated digit groups"},
	{id: "closed-print", fact: "a closed export (nvme-tcp-export=no) prints its port, NQN and allowed host"},
	{id: "add-closed", fact: "/disk add takes nvme-tcp-export=no with a port and NQN and keeps them for a later yes"},
	{id: "find-where-and", fact: "[find where a=x and b=y] selects on /disk, with nvme-tcp-export and the allowed host as conditions"},
	{id: "set-two-props", fact: "one set of nvme-tcp-export and the allowed host applies both"},
	{id: "cas-stale", fact: "a conditional set whose [find where] no longer matches changes nothing"},
	{id: "find-empty", fact: "a set whose [find] matches nothing prints nothing (the client also takes `failure: no such item`)"},
	{id: "allow-host-uuid", fact: "a uuid host NQN that never connected is accepted as allowed host and kept while closed"},
	{id: "print-where", fact: "print detail where <property>=<value> tests the property itself, also one a closed disk does not print"},
	{id: "allow-host-single", fact: "the allowed host holds one host NQN",
		unmeasured: "the driver never sets more than one; a list would need a syntax the client does not send"},
	{id: "allow-host-enforced", fact: "an allowed host NQN lets that host connect (\"\" lets any host)"},
	{id: "host-change-conns", fact: "a change of the allowed host keeps established connections (as Linux nvmet)",
		unmeasured: "needs a host writing across the change: see docs/routeros.md, Storage fencing, to check it by hand"},
	{id: "export-off-drops", fact: "nvme-tcp-export=no drops every established connection",
		unmeasured: "needs a host writing across the change: see docs/routeros.md, Storage fencing, to check it by hand"},
	{id: "password-secret", fact: "nvme-tcp-server-password, set with the allowed host, is taken and the disk prints a read-only nvme-tcp-server-secret in the DHHC-1 form"},
	{id: "password-enforced", fact: "with a password, the allowed host connects presenting that secret (DH-HMAC-CHAP) and is refused without it"},
	{id: "resize-grow", fact: "set file-size= grows a disk"},
	{id: "disk-remove-keeps-file", fact: "/disk remove leaves the backing file, which /file remove deletes",
		unmeasured: "the client removes both in one call and checks that both are gone; either way nothing is left"},
	{id: "file-remove-in-use", fact: "/file remove is refused while a disk uses the file"},
	{id: "file-regex", fact: "/file print where name~\"^...\" selects by regular expression"},
	{id: "clock-file-time", fact: "/system clock print prints time and date, and a file's last-modified is read on the same clock"},
	{id: "no-such-item", fact: "copy-from of a missing disk fails with `failure: no such item`",
		unmeasured: "the client reads a copy's source first and sends no copy-from of a missing disk; one deleted in between is refused whatever the text"},
	{id: "copy-complete", fact: "/disk add copy-from returns when the copy is complete, its disk listed then"},
	{id: "copy-hidden-while-copying", fact: "a copy's disk is not listed while it is still copying",
		unmeasured: "the scratch copies are too small to look during one"},
	{id: "copy-inherits", fact: "copy-from takes the properties the add does not set from the source (RouterOS CLI manual)"},
	{id: "copy-data", fact: "copy-from copies the source file's data"},
	{id: "copy-independent", fact: "a copy keeps its data when its source is deleted"},
	{id: "keepalive", fact: "RouterOS' SSH server answers no keepalive@openssh.com request",
		unmeasured: "the client does not depend on the answer (command deadlines and TCP keepalive)"},
}

func factByID(id string) (factDef, bool) {
	for _, f := range selftestFacts {
		if f.id == id {
			return f, true
		}
	}
	return factDef{}, false
}
