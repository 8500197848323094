{{/* The namespace of every namespaced object. */}}
{{- define "rds-csi.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* The labels every object carries; component adds one. */}}
{{- define "rds-csi.labels" -}}
app.kubernetes.io/name: rds-csi
app.kubernetes.io/part-of: rds-csi
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/* The driver's image reference. */}}
{{- define "rds-csi.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The driver container's image and pull policy lines. */}}
{{- define "rds-csi.imageLines" -}}
image: {{ include "rds-csi.image" . }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/* What the leader-elected sidecars of the controller share: the
namespace variable, their health port, probe, socket and limits. */}}
{{- define "rds-csi.sidecarCommon" -}}
env:
  - name: NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
{{- if .podName }}
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
{{- end }}
ports:
  - name: {{ .port }}
    containerPort: {{ .containerPort }}
livenessProbe:
  httpGet: {path: /healthz/leader-election, port: {{ .port }}}
  initialDelaySeconds: 10
  periodSeconds: 20
  timeoutSeconds: 10
  failureThreshold: 3
volumeMounts:
  - name: socket-dir
    mountPath: /csi
resources:
  requests: {cpu: 10m, memory: 32Mi}
  limits: {memory: 256Mi}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}
