// Package rdssim is a simulated MikroTik ROSE Data Server for tests and
// local runs: a real SSH server (public-key auth, a persistent host key)
// that runs the RouterOS command subset of docs/routeros.md, one command per
// SSH exec, against real sparse files in a data directory.
//
// What it simulates:
//   - /disk add (type=file, new or copy-from=[find slot=...]), /disk set
//     (grow, export settings, allowed host), /disk remove, /disk print
//     detail [where ...]; the pool disk with size= and free=;
//   - /file print detail [where name=...], /file remove;
//   - /system resource print; /system clock print (Config.Now, in UTC
//     like the files' last-modified);
//   - RouterOS error text: "failure: ...", "syntax error (line 1 column N)",
//     "bad command name ...", "expected end of command ...",
//     "invalid value for argument ...", with exit status 0 (1 with
//     Config.ExitStatusOnFailure);
//   - print output laid out for a terminal 80 columns wide, as the hardware
//     printed it over SSH: properties wrapped between them, a value longer
//     than a line broken in the middle (at the width, or before a '-' with
//     Config.ValueBreak hyphen), the Flags legend (naming the flags the
//     listing uses; all of them, printed alone, when nothing matches)
//     wrapped after its `;`, and each entry's flags in the legend's
//     columns, blanks for flags not set (`26 BM `, ` 1 B t`); the login
//     name's console options ("admin+ct511w4098h") set the width per
//     connection;
//   - a closed export's port, NQN and allowed host left out of the print,
//     with Config.ClosedExportProps hidden (as RAID disks printed on
//     RDS2216 hardware); conditions still see them;
//   - images mounted beside the driver's disks (AddMountedImage: the M
//     flag and a mount point);
//   - SSH global requests (keepalive@openssh.com) refused, ignored or
//     answered by closing the connection (Config.GlobalRequests), since
//     RouterOS does not support them;
//   - where/find conditions `key=value` and `key~"regex"`, joined by `and`,
//     with or without `where` inside [find ...]; a condition on a property
//     the menu does not have is "expected end of command";
//   - copies that take time (Config.CopyRate): /disk add copy-from returns,
//     and its disk appears, only when the copy is done; meanwhile other
//     commands run and the copy's file cannot be removed.
//
// Disks are backed by files under Config.DataDir ("/storage-pool/k8s/a.img"
// is DataDir/k8s/a.img) of exactly the requested size, sparse, so a test can
// attach them to loop devices (BackingFile). Copies are independent files
// with the source's content. The disk table is kept in a JSON file in the
// data directory, so a restarted simulator sees the same disks.
//
// Free space is the pool size minus the logical sizes of all files in the
// pool, including files whose disk was removed: /disk remove leaves the file
// behind, as on RouterOS, and only /file remove frees its space.
//
// With Config.Exporter set to an NvmetExporter, disks with
// nvme-tcp-export=yes are real NVMe/TCP targets of the kernel's nvmet
// (configfs): the subsystem, namespace, port and allowed host follow the
// disk table after every command and at start-up (exporter.go, nvmet.go).
//
// Established connections: nvme-tcp-export=no, a removed disk, or a changed
// port or NQN drop them (the nvmet backend takes the subsystem off its
// port). What a change of the allowed host does is Config.AllowHostChange,
// because RouterOS' behaviour is not known: keep (the default, as Linux
// nvmet checks the host at connect only) or drop (the nvmet backend takes
// the subsystem off its port and back, after allowed_hosts changed).
// ConnectionDrops counts the drops per slot, with or without a backend.
//
// The hardware under the pool (issue 27): an unconditioned /disk print
// also lists a RAID-6 array (ArraySlot) of six NVMe drives (hardware.go);
// `/disk print stats detail` prints every disk's I/O counters, driven by
// what is written to the backing files, and the drives' S.M.A.R.T. values;
// `/disk monitor-traffic <slot> once` prints a slot's counters and rates
// (diskio.go). Tests fail or remove a drive, set its values, and add exact
// I/O counts (FailDrive, RemoveDrive, RestoreArray, SetDriveSmart, AddIO;
// over the fault control protocol: drive, smart, io).
//
// Tests steer it at run time (goroutine-safe): added latency, failing,
// garbling, hanging or dropping the Nth matching command, holding it to
// land late (after a delay or when released, after later commands, with
// its client gone), refusing connections; Commands is the log of every
// command with its reply, ExportLog which command changed which export.
// Another process steers it through the line protocol of faultcontrol.go
// (rds-sim --fault-control).
//
// Behaviour the real RDS was not observed to have, chosen to be strict:
// /file remove of a file that a disk still uses fails ("file is in use"),
// /disk add requires slot=, and values may not contain `$`.
//
// It must never be used as, or in place of, production storage; never run
// a command through a shell or touch a path outside its data directory;
// never round a size (a disk file is exactly the bytes asked for); and
// never import pkg/rds: it implements the contract independently so that
// it can catch the client's mistakes instead of sharing them.
package rdssim
