{{/*
Checks across values that values.schema.json cannot express, each failing
the render with the value named and what to set instead: a value the
driver refuses at start (a crashloop) or the API server refuses (an
install that fails half-way) is refused here, before anything is applied.
*/}}
{{- define "rds-csi.validate" -}}
{{- $v := .Values -}}
{{- if and $v.namespace.create (not $v.namespace.name) -}}
{{- fail "namespace.name is empty while namespace.create is true: the chart would create the release's own namespace, where Helm keeps its release record (an uninstall would delete it). Set namespace.name (default rds-csi), or namespace.create=false to install into the release's namespace (-n)" -}}
{{- end -}}
{{- include "rds-csi.checkHost" (dict "name" "rds.address" "value" $v.rds.address "port" "rds.port") -}}
{{- with $v.nvme.address -}}
{{- include "rds-csi.checkHost" (dict "name" "nvme.address" "value" . "port" "nvme.port") -}}
{{- end -}}
{{- /* The driver names the RDS in topology by --rds-name, default the address. */ -}}
{{- if and (not $v.rds.name) (not (regexMatch "^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" $v.rds.address)) -}}
{{- fail (printf "rds.name is required: rds.address %q is not a Kubernetes label value, and the RDS is named in volume topology (a node label) by rds.name, default rds.address" $v.rds.address) -}}
{{- end -}}
{{- if eq $v.rds.volumePath (printf "/%s" $v.rds.pool) -}}
{{- fail (printf "rds.volumePath %q is the storage pool itself (rds.pool %q): the driver refuses it; give a directory inside it, e.g. /%s/kubernetes-volumes" $v.rds.volumePath $v.rds.pool $v.rds.pool) -}}
{{- end -}}
{{- with $v.rds.sshSecret -}}
{{- if and .create .privateKey (not (regexMatch "-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----" .privateKey)) -}}
{{- fail "rds.sshSecret.privateKey is not a private key in PEM form (-----BEGIN OPENSSH PRIVATE KEY----- ...): give the private key file (e.g. --set-file rds.sshSecret.privateKey=id_ed25519); its .pub goes to the RDS" -}}
{{- end -}}
{{- if and .create .knownHosts (not (regexMatch `(?m)^[^#\s]\S*\s+\S+\s+\S+` .knownHosts)) -}}
{{- fail "rds.sshSecret.knownHosts is not a known_hosts file (lines of HOST KEYTYPE KEY, as ssh-keyscan prints them; a bare host key lacks the host): e.g. --set-file rds.sshSecret.knownHosts=known_hosts" -}}
{{- end -}}
{{- if and .create .knownHosts -}}
{{- include "rds-csi.checkKnownHosts" (dict "knownHosts" .knownHosts "address" $v.rds.address "port" (int $v.rds.port)) -}}
{{- end -}}
{{- end -}}
{{- range $comp := list "controller" "node" -}}
{{- range $kind, $quantities := (get $v $comp).resources -}}
{{- range $name, $q := $quantities -}}
{{- /* The API server's quantity (resource.Quantity), not negative. */ -}}
{{- if or (and (kindIs "string" $q) (not (regexMatch "^\\+?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?$" $q))) (and (not (kindIs "string" $q)) (lt (float64 $q) 0.0)) -}}
{{- fail (printf "%s.resources.%s.%s %v is not a resource quantity (a number with an optional unit, e.g. 100m, 0.5, 256Mi, 1Gi): the API server would refuse the %s" $comp $kind $name $q (ternary "Deployment" "DaemonSet" (eq $comp "controller"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* The boxes of extraRDS, as the driver checks its --rds-config:
each named (a label value), none twice (without case, the default box's
name included), none at another's SSH address or NVMe/TCP target. */ -}}
{{- $boxName := default $v.rds.address $v.rds.name -}}
{{- $boxes := dict (lower $boxName) "the default RDS (rds.name, or rds.address)" -}}
{{- $exact := dict $boxName true -}}
{{- $sshAt := dict (printf "%s:%v" (lower (trimSuffix "." $v.rds.address)) $v.rds.port) "the default RDS (rds.address:rds.port)" -}}
{{- $nvmeAt := dict (printf "%s:%v" (lower (trimSuffix "." (default $v.rds.address $v.nvme.address))) $v.nvme.port) "the default RDS (nvme.address:nvme.port)" -}}
{{- if and $v.extraRDS (gt (len $boxName) 59) -}}
{{- fail (printf "the default RDS's name %q is %d characters: with extraRDS at most 59 (nodes are labelled topology.rds.csi.srvlab.io/rds.<name>); set rds.name" $boxName (len $boxName)) -}}
{{- end -}}
{{- range $i, $b := $v.extraRDS -}}
{{- $at := printf "extraRDS[%d] (%q)" $i $b.name -}}
{{- include "rds-csi.checkHost" (dict "name" (printf "%s.address" $at) "value" $b.address "port" (printf "extraRDS[%d].port" $i)) -}}
{{- with $b.nvmeAddress -}}
{{- include "rds-csi.checkHost" (dict "name" (printf "%s.nvmeAddress" $at) "value" . "port" (printf "extraRDS[%d].nvmePort" $i)) -}}
{{- end -}}
{{- with get $boxes (lower $b.name) -}}
{{- fail (printf "%s: the name is taken by %s already (names are compared without case)" $at .) -}}
{{- end -}}
{{- $_ := set $boxes (lower $b.name) $at -}}
{{- $_ := set $exact $b.name true -}}
{{- $ssh := printf "%s:%v" (lower (trimSuffix "." $b.address)) (default 22 $b.port) -}}
{{- with get $sshAt $ssh -}}
{{- fail (printf "%s: SSH address %s is %s's already: two entries would be one RDS under two names" $at $ssh .) -}}
{{- end -}}
{{- $_ := set $sshAt $ssh $at -}}
{{- $nvme := printf "%s:%v" (lower (trimSuffix "." (default $b.address $b.nvmeAddress))) (default $v.nvme.port $b.nvmePort) -}}
{{- with get $nvmeAt $nvme -}}
{{- fail (printf "%s: NVMe/TCP target %s is %s's already: nodes could not tell their volumes apart" $at $nvme .) -}}
{{- end -}}
{{- $_ := set $nvmeAt $nvme $at -}}
{{- with $b.commandTimeout -}}
{{- $s := float64 (include "rds-csi.seconds" .) -}}
{{- if or (lt $s 1.0) (gt $s 600.0) -}}
{{- fail (printf "%s: commandTimeout %s is outside 1s..10m, or the driver refuses to start" $at .) -}}
{{- end -}}
{{- end -}}
{{- if eq (default $v.rds.volumePath $b.volumePath) (printf "/%s" (default $v.rds.pool $b.pool)) -}}
{{- fail (printf "%s: volumePath %q is its storage pool itself: give a directory inside it" $at (default $v.rds.volumePath $b.volumePath)) -}}
{{- end -}}
{{- end -}}
{{- range $i, $sc := $v.storageClasses -}}
{{- with $sc.parameters -}}
{{- if and (hasKey . "rds") (not (hasKey $exact (get . "rds"))) -}}
{{- fail (printf "storageClasses[%d].parameters.rds %q names no RDS of the chart (rds.name, or rds.address, and extraRDS[].name): the driver refuses its claims at CreateVolume" $i (get . "rds")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $names := dict -}}
{{- range $i, $sc := $v.storageClasses -}}
{{- if hasKey $names $sc.name -}}
{{- fail (printf "storageClasses[%d].name %q is also storageClasses[%d].name: StorageClass names are cluster-wide and unique" $i $sc.name (get $names $sc.name)) -}}
{{- end -}}
{{- $_ := set $names $sc.name $i -}}
{{- end -}}
{{- /* Flags the chart sets (from a value, or fixed): given again in
extraArgs the driver refuses the second, so each is refused here with the
value to set instead. */ -}}
{{- $value := "is set by the chart from %s: set that value instead" -}}
{{- $fixed := "is set by the chart (%s) and cannot be changed" -}}
{{- $common := dict
  "mode" (printf $fixed "controller or node, by pod")
  "endpoint" (printf $fixed "the socket the sidecars share")
  "rds-address" (printf $value "rds.address")
  "rds-name" (printf $value "rds.name")
  "rds-config" (printf $value "extraRDS (the ConfigMap's rds-config.yaml)")
  "http-endpoint" (printf $fixed "the ports the probes and metrics use")
  "storage-fencing" (printf $value "storageFencing.enabled, which also grants the controller the RBAC storage fencing needs")
  "out-of-service-taint" (printf $value "storageFencing.outOfServiceTaint, which also grants the controller update on nodes")
  "node-lease" (printf $value "storageFencing.enabled, which also gives the node plugin its API token and Lease RBAC")
  "driver-name" "must stay rds.csi.srvlab.io, the name the chart's CSIDriver, StorageClasses and kubelet registration path use"
  "attachment-key-file" "names a file the chart does not mount; with storageFencing.enabled the attachment key is derived from the SSH key in rds.sshSecret"
  "kubeconfig" "names a file the chart does not mount; the driver uses its ServiceAccount"
  "version" "makes the driver print its version and exit" -}}
{{- $election := printf $fixed "leader election in the pod's namespace" -}}
{{- $controller := merge (dict
  "v" (printf $value "controller.logLevel")
  "rds-port" (printf $value "rds.port")
  "rds-user" (printf $value "rds.user")
  "rds-pool" (printf $value "rds.pool")
  "rds-volume-path" (printf $value "rds.volumePath")
  "rds-key-file" (printf $value "rds.sshSecret (mounted at /etc/rds-csi/ssh)")
  "rds-known-hosts-file" (printf $value "rds.sshSecret (mounted at /etc/rds-csi/ssh)")
  "nvme-address" (printf $value "nvme.address")
  "nvme-port" (printf $value "nvme.port")
  "leader-election" $election
  "leader-election-namespace" $election
  "leader-election-lease-duration" $election
  "leader-election-renew-deadline" $election
  "leader-election-retry-period" $election) $common -}}
{{- $node := merge (dict
  "v" (printf $value "node.logLevel")
  "node-id" (printf $fixed "the name of the pod's Node")
  "node-nvme-dir" "must stay /etc/nvme, where the chart mounts the host's NVMe identity"
  "node-state-dir" "must stay beside the socket, in the host's kubelet plugin directory of the driver that the chart mounts (records kept anywhere else are lost with the pod)"
  "node-connector" "is node.labLoopDataDir (labs only, docs/node.md): without it the node plugin connects volumes over NVMe/TCP"
  "node-loop-data-dir" "is node.labLoopDataDir (labs only, docs/node.md)") $common -}}
{{- /* Flags of one mode only: the driver refuses them in the other. */ -}}
{{- range $f := list "rds-port" "rds-user" "rds-key-file" "rds-known-hosts-file" "rds-insecure-skip-host-key-check" "rds-login-options" "rds-pool" "rds-volume-path" "rds-command-timeout" "rds-health-interval" "storage-fencing" "attachment-key-file" "export-auth" "copy-from-data" "publish" "kubeconfig" "kube-api-content-type" "leader-election" "leader-election-namespace" "leader-election-lease-duration" "leader-election-renew-deadline" "leader-election-retry-period" "attach-grace-period" "not-ready-threshold" "heartbeat-threshold" "fence-guard-share" "migration-timeout" "orphaned-claim-threshold" "watch-disconnect-threshold" "fence-call-timeout" "out-of-service-taint" "export-reconcile-period" -}}
{{- if not (hasKey $node $f) -}}
{{- $_ := set $node $f "is a flag of the controller, which the node plugin does not read: give it in controller.extraArgs" -}}
{{- end -}}
{{- end -}}
{{- range $f := list "node-connector" "node-loop-data-dir" "node-nvme-dir" "node-state-dir" "nvme-ctrl-loss-timeout" "nvme-fast-io-fail-timeout" "max-volumes-per-node" "node-lease-duration" -}}
{{- if not (hasKey $controller $f) -}}
{{- $_ := set $controller $f "is a flag of the node plugin, which the controller does not read: give it in node.extraArgs" -}}
{{- end -}}
{{- end -}}
{{- $known := dict -}}
{{- range splitList "\n" (.Files.Get "driver-flags.txt") -}}
{{- if and (trim .) (not (hasPrefix "#" .)) -}}
{{- $f := splitList " " (trim .) -}}
{{- $_ := set $known (first $f) (last $f) -}}
{{- end -}}
{{- end -}}
{{- include "rds-csi.checkArgs" (dict "name" "controller.extraArgs" "args" $v.controller.extraArgs "owned" $controller "known" $known
  "fencing" $v.storageFencing.enabled "taint" (and $v.storageFencing.enabled $v.storageFencing.outOfServiceTaint)) -}}
{{- include "rds-csi.checkArgs" (dict "name" "node.extraArgs" "args" $v.node.extraArgs "owned" $node "known" $known "fencing" false "taint" false) -}}
{{- end -}}

{{/* checkArgs: extra flags, each one the driver has (driver-flags.txt),
none the chart sets, none twice, each with a value the driver takes
(checkArgValue), and together with the chart's own flags (.fencing: the
pod runs with --storage-fencing=allow-host, .taint: with
--out-of-service-taint) a set the driver starts with. */}}
{{- define "rds-csi.checkArgs" -}}
{{- $seen := dict -}}
{{- $got := dict -}}
{{- range $i, $arg := .args -}}
{{- $flag := regexFind "^--[^=]+" $arg | trimPrefix "--" -}}
{{- if not (hasKey $.known $flag) -}}
{{- fail (printf "%s[%d] %q: the driver has no flag --%s (rds-csi-driver -h lists them; docs/deploy.md describes the usual ones)" $.name $i $arg $flag) -}}
{{- end -}}
{{- with get $.owned $flag -}}
{{- fail (printf "%s[%d] %q: --%s %s" $.name $i $arg $flag .) -}}
{{- end -}}
{{- if hasKey $seen $flag -}}
{{- fail (printf "%s gives --%s twice (%q, %q): the driver refuses a flag given twice; keep one" $.name $flag (get $seen $flag) $arg) -}}
{{- end -}}
{{- $_ := set $seen $flag $arg -}}
{{- include "rds-csi.checkArgValue" (dict "name" (printf "%s[%d]" $.name $i) "arg" $arg "flag" $flag "kind" (get $.known $flag) "got" $got "fencing" $.fencing) -}}
{{- end -}}
{{- /* Checks across flags, with the driver's defaults for those not given
(with storage fencing: 20s for both thresholds). */ -}}
{{- $dflt := ternary 20.0 0.0 (eq (toString $.fencing) "true") -}}
{{- $hb := $dflt -}}
{{- with get $got "heartbeat-threshold" -}}
{{- $hb = .s -}}
{{- if and (gt .s 0.0) (not $.fencing) -}}
{{- if eq $.name "node.extraArgs" -}}
{{- fail (printf "%s %q: --heartbeat-threshold needs --storage-fencing=allow-host, which only the controller runs with (storageFencing.enabled): give it in controller.extraArgs" $.name .arg) -}}
{{- else -}}
{{- fail (printf "%s %q: --heartbeat-threshold needs storage fencing (the driver refuses it without --storage-fencing=allow-host, since nothing would cut off a node whose heartbeat stopped): set storageFencing.enabled=true, or drop the flag" $.name .arg) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $nr := $dflt -}}
{{- with get $got "not-ready-threshold" }}{{ $nr = .s }}{{ end -}}
{{- if and $.taint (le $nr 0.0) (le $hb 0.0) -}}
{{- fail (printf "storageFencing.outOfServiceTaint is true while %s turns off both --not-ready-threshold and --heartbeat-threshold: the driver refuses the taint with no threshold to fence by; set storageFencing.outOfServiceTaint=false, or give one of them a positive duration" $.name) -}}
{{- end -}}
{{- with get $seen "fence-guard-share" -}}
{{- if and (ne $.name "node.extraArgs") (le $nr 0.0) (le $hb 0.0) -}}
{{- fail (printf "%s %q: --fence-guard-share needs a positive --not-ready-threshold or --heartbeat-threshold (the driver refuses it with both 0: no node is fenced, so the mass-outage guard guards nothing): set storageFencing.enabled=true, give one of them a positive duration, or drop the flag" $.name .) -}}
{{- end -}}
{{- end -}}
{{- with get $seen "export-reconcile-period" -}}
{{- if not $.fencing -}}
{{- fail (printf "%s %q: --export-reconcile-period needs storage fencing (the driver refuses it without --storage-fencing=allow-host: there is no export to reconcile)%s" $.name . (ternary ": give it in controller.extraArgs with storageFencing.enabled=true" ": set storageFencing.enabled=true, or drop the flag" (eq $.name "node.extraArgs"))) -}}
{{- end -}}
{{- end -}}
{{- /* The driver's defaults: 5m and 30s. */ -}}
{{- $ctrlLoss := dict "arg" "the default --nvme-ctrl-loss-timeout=5m0s" "s" 300.0 -}}
{{- $fastIOFail := dict "arg" "the default --nvme-fast-io-fail-timeout=30s" "s" 30.0 -}}
{{- with get $got "nvme-ctrl-loss-timeout" }}{{ $ctrlLoss = . }}{{ end -}}
{{- with get $got "nvme-fast-io-fail-timeout" }}{{ $fastIOFail = . }}{{ end -}}
{{- if and (gt $fastIOFail.s 0.0) (ge $fastIOFail.s $ctrlLoss.s) -}}
{{- fail (printf "%s: %s is not shorter than %s: the driver refuses a fast I/O failure that is not shorter than the connection loss timeout; shorten it, or give --nvme-fast-io-fail-timeout=0 (off)" $.name $fastIOFail.arg $ctrlLoss.arg) -}}
{{- end -}}
{{- end -}}

{{/* checkArgValue: the value of one extra flag, as the driver's flag
package parses it (by the type driver-flags.txt gives) and as the driver
then checks it (a range, below). Durations are put into .got (flag ->
arg, seconds) for the checks across flags. */}}
{{- define "rds-csi.checkArgValue" -}}
{{- $hasValue := contains "=" .arg -}}
{{- $val := regexReplaceAll "^--[^=]+=" .arg "" -}}
{{- $bad := printf "%s %q: --%s" .name .arg .flag -}}
{{- if eq .kind "bool" -}}
{{- if and $hasValue (not (has $val (list "1" "0" "t" "f" "T" "F" "true" "false" "TRUE" "FALSE" "True" "False"))) -}}
{{- fail (printf "%s takes true or false, not %q" $bad $val) -}}
{{- end -}}
{{- if and (eq .flag "publish") $hasValue (has $val (list "0" "f" "F" "false" "FALSE" "False")) -}}
{{- fail (printf "%s: the chart's CSIDriver has attachRequired: true and every volume goes through ControllerPublish (storage fencing, the attachment index); without it the driver would not serve the attach the CSIDriver requires. Drop the flag" $bad) -}}
{{- end -}}
{{- else if not $hasValue -}}
{{- fail (printf "%s needs a value (--%s=VALUE): the driver refuses a %s flag without one" $bad .flag .kind) -}}
{{- else if eq .kind "duration" -}}
{{- if not (regexMatch "^[-+]?(0|(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$" $val) -}}
{{- fail (printf "%s: %q is not a duration (e.g. 30s, 5m, 1h30m)" $bad $val) -}}
{{- end -}}
{{- $s := float64 (include "rds-csi.seconds" $val) -}}
{{- $_ := set .got .flag (dict "arg" .arg "s" $s) -}}
{{- /* flag: zero (0 allowed), min and max seconds (inclusive), the range in words. */ -}}
{{- $ranges := dict
  "attach-grace-period" (list true 0.0 1e12 "not negative")
  "not-ready-threshold" (list true 5.0 86400.0 "0 (never) or 5s to 24h")
  "orphaned-claim-threshold" (list true 60.0 86400.0 "0 (never) or 1m to 24h")
  "heartbeat-threshold" (list true 5.0 86400.0 "0 (never) or 5s to 24h")
  "migration-timeout" (list false 10.0 86400.0 "10s to 24h")
  "watch-disconnect-threshold" (list false 5.0 600.0 "5s to 10m")
  "fence-call-timeout" (list false 1.0 600.0 "1s to 10m")
  "export-reconcile-period" (list false 1.0 3600.0 "1s to 1h")
  "rds-command-timeout" (list false 1.0 600.0 "1s to 10m")
  "rds-health-interval" (list true 5.0 3600.0 "0 (off) or 5s to 1h")
  "shutdown-grace" (list false 1.0 600.0 "1s to 10m")
  "nvme-ctrl-loss-timeout" (list false 30.0 3600.0 "30s to 1h")
  "nvme-fast-io-fail-timeout" (list true 1.0 1e12 "0 (off) or at least 1s")
  "node-lease-duration" (list false 10.0 120.0 "whole seconds, 10s to 2m") -}}
{{- /* Without fencing the driver names that first (checkArgs). */ -}}
{{- if and (eq .flag "heartbeat-threshold") (not .fencing) }}{{ $ranges = dict }}{{ end -}}
{{- with get $ranges .flag -}}
{{- if or (not (or (and (index . 0) (eq $s 0.0)) (and (ge $s (index . 1)) (le $s (index . 2))))) (and (eq $.flag "node-lease-duration") (ne $s (floor $s))) -}}
{{- fail (printf "%s must be %s, not %s, or the driver refuses to start" $bad (index . 3) $val) -}}
{{- end -}}
{{- end -}}
{{- else if or (eq .kind "int") (eq .kind "uint") -}}
{{- if not (regexMatch (ternary "^[-+]?[0-9]+$" "^[+]?[0-9]+$" (eq .kind "int")) $val) -}}
{{- fail (printf "%s: %q is not a whole number%s" $bad $val (ternary "" " of 0 or more" (eq .kind "int"))) -}}
{{- end -}}
{{- if and (eq .flag "max-volumes-per-node") (hasPrefix "-" $val) -}}
{{- fail (printf "%s must not be negative (0: no limit), or the driver refuses to start" $bad) -}}
{{- end -}}
{{- else if eq .kind "float" -}}
{{- if not (regexMatch "^[-+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+)?$" $val) -}}
{{- fail (printf "%s: %q is not a number" $bad $val) -}}
{{- end -}}
{{- if and (eq .flag "fence-guard-share") (or (le (float64 $val) 0.0) (gt (float64 $val) 1.0)) -}}
{{- fail (printf "%s must be in (0, 1], not %s, or the driver refuses to start" $bad $val) -}}
{{- end -}}
{{- else if and (eq .flag "copy-from-data") (not (has $val (list "supported" "unsupported"))) -}}
{{- fail (printf "%s must be supported or unsupported, not %q" $bad $val) -}}
{{- else if eq .flag "nqn-prefix" -}}
{{- /* rds.ValidateNQN of the prefix and a volume ID, which is 40 bytes
(pvc-<uuid>), within an NQN's 223. */ -}}
{{- if or (gt (len $val) 183) (not (regexMatch "^nqn\\.[0-9]{4}-[0-9]{2}\\.[A-Za-z0-9.-]+(:[A-Za-z0-9._:-]*)?$" $val)) -}}
{{- fail (printf "%s %q does not form the volumes' NQNs (the prefix and a volume ID, pvc-<uuid>): it must look like nqn.2000-02.com.mikrotik: and be at most 183 bytes" $bad $val) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* seconds: a Go duration (checked already) in seconds, as a string. */}}
{{- define "rds-csi.seconds" -}}
{{- $d := . -}}
{{- $units := dict "ns" 1e-9 "us" 1e-6 "µs" 1e-6 "μs" 1e-6 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" $d -1 -}}
{{- $unit := regexFind "(ns|us|µs|μs|ms|s|m|h)$" . -}}
{{- $total = addf $total (mulf (float64 (trimSuffix $unit .)) (get $units $unit)) -}}
{{- end -}}
{{- if hasPrefix "-" $d }}{{ $total = mulf $total -1.0 }}{{ end -}}
{{- $total -}}
{{- end -}}

{{/* checkKnownHosts: rds.sshSecret.knownHosts has a line for the RDS as
the driver looks it up (knownhosts.Normalize: the address alone on port
22, else [address]:port); the driver refuses to start without one. Hashed
(|1|...) and wildcard host patterns cannot be matched here and pass. */}}
{{- define "rds-csi.checkKnownHosts" -}}
{{- $want := .address -}}
{{- if ne .port 22 }}{{ $want = printf "[%s]:%d" .address .port }}{{ end -}}
{{- $found := false -}}
{{- range splitList "\n" .knownHosts -}}
{{- $f := splitList " " (regexReplaceAll "\\s+" (trim .) " ") -}}
{{- if and (ge (len $f) 3) (ne (first $f) "@revoked") (not (hasPrefix "#" (first $f))) -}}
{{- if hasPrefix "@" (first $f) }}{{ $f = rest $f }}{{ end -}}
{{- $hosts := first $f -}}
{{- if or (hasPrefix "|" $hosts) (regexMatch "[*?]" $hosts) (has $want (splitList "," $hosts)) }}{{ $found = true }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "rds.sshSecret.knownHosts has no line for %s (rds.address%s): the driver looks the RDS's host key up by that name and refuses to start without it; e.g. ssh-keyscan -p %d %s > known_hosts, then --set-file rds.sshSecret.knownHosts=known_hosts" $want (ternary "" " and rds.port" (eq .port 22)) .port .address) -}}
{{- end -}}
{{- end -}}

{{/* checkHost: an address as the driver takes it (rds.ValidateHost): a host
name or an IP address alone, an IPv6 address without brackets. */}}
{{- define "rds-csi.checkHost" -}}
{{- $h := .value -}}
{{- if regexMatch "^[^:]+:[0-9]+$" $h -}}
{{- fail (printf "%s %q has a port: give the host alone (%s) and the port in %s" .name $h (regexReplaceAll ":[0-9]+$" $h "") .port) -}}
{{- else if regexMatch "^\\[.*\\]$" $h -}}
{{- fail (printf "%s %q: give an IPv6 address without brackets (%s)" .name $h (trimAll "[]" $h)) -}}
{{- else if not (or (regexMatch "^[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*$" $h) (and (le (len $h) 253) (regexMatch "^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.?$" $h))) -}}
{{- fail (printf "%s %q is not a host name or an IP address" .name $h) -}}
{{- end -}}
{{- end -}}
