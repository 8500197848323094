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
  "http-endpoint" (printf $fixed "the ports the probes and metrics use")
  "storage-fencing" (printf $value "storageFencing.enabled, which also grants the controller the RBAC storage fencing needs")
  "out-of-service-taint" (printf $value "storageFencing.outOfServiceTaint, which also grants the controller update on nodes")
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
  "node-connector" "is for labs without a cluster (docs/node.md): the chart's node plugin connects volumes over NVMe/TCP"
  "node-loop-data-dir" "is for labs without a cluster (docs/node.md): the chart's node plugin connects volumes over NVMe/TCP") $common -}}
{{- $known := dict -}}
{{- range splitList "\n" (.Files.Get "driver-flags.txt") -}}
{{- if and (trim .) (not (hasPrefix "#" .)) -}}
{{- $_ := set $known (trim .) true -}}
{{- end -}}
{{- end -}}
{{- include "rds-csi.checkArgs" (dict "name" "controller.extraArgs" "args" $v.controller.extraArgs "owned" $controller "known" $known) -}}
{{- include "rds-csi.checkArgs" (dict "name" "node.extraArgs" "args" $v.node.extraArgs "owned" $node "known" $known) -}}
{{- end -}}

{{/* checkArgs: extra flags, each one the driver has (driver-flags.txt),
none the chart sets, none twice. */}}
{{- define "rds-csi.checkArgs" -}}
{{- $seen := dict -}}
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
