{{/*
Names, labels, and the plugin's config file. The config file is built in one place
("nvplugin.configData") and used by the ConfigMap and by the checksum/config annotation, so the
annotation changes exactly when the file does.
*/}}

{{- define "nvplugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nvplugin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "nvplugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nvplugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nvplugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nvplugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nvplugin.labels" -}}
helm.sh/chart: {{ include "nvplugin.chart" . }}
{{ include "nvplugin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nvplugin.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The plugin socket: <devicePluginPath>/nvplugin-<part of resourceName after "/">.sock, the name
`nvplugin serve` gives its socket (nvplugin/plugin/resources.py: socket_name).
*/}}
{{- define "nvplugin.socketPath" -}}
{{- printf "%s/nvplugin-%s.sock" (trimSuffix "/" .Values.devicePluginPath) (last (splitList "/" .Values.resourceName)) }}
{{- end }}

{{- define "nvplugin.configDir" -}}/etc/nvplugin{{- end }}
{{- define "nvplugin.configFile" -}}config.yaml{{- end }}

{{- define "nvplugin.configMapName" -}}
{{- if .Values.existingConfigMap.name }}
{{- .Values.existingConfigMap.name }}
{{- else }}
{{- printf "%s-config" (include "nvplugin.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{- define "nvplugin.configMapKey" -}}
{{- if .Values.existingConfigMap.name }}
{{- .Values.existingConfigMap.key }}
{{- else }}
{{- include "nvplugin.configFile" . }}
{{- end }}
{{- end }}

{{/*
True (non-empty) when values.config holds anything: a non-empty map or a non-blank string.
*/}}
{{- define "nvplugin.userConfigSet" -}}
{{- if kindIs "string" .Values.config }}
{{- if trim .Values.config }}true{{ end }}
{{- else if .Values.config }}true
{{- end }}
{{- end }}

{{/*
values.config as a map: a map is deep-copied (so merging never changes .Values); a string is
parsed as YAML and must be a mapping.
*/}}
{{- define "nvplugin.userConfig" -}}
{{- $cfg := dict }}
{{- if kindIs "string" .Values.config }}
{{- if trim .Values.config }}
{{- $cfg = fromYaml .Values.config }}
{{- if hasKey $cfg "Error" }}
{{- fail (printf "values.config: the string is not a YAML mapping (the nvplugin config file format): %s" (get $cfg "Error")) }}
{{- end }}
{{- end }}
{{- else if .Values.config }}
{{- $cfg = deepCopy .Values.config }}
{{- end }}
{{- toJson $cfg }}
{{- end }}

{{/*
Put one chart value into the config map at a key path, or (check only) make sure the config does
not say something else there. args: cfg (map), path (list of keys), value, from (the values key
named in messages), set (bool). A key set both in values.config and by a chart value to different
values fails: the plugin would be told two things, and one would be silently lost.
*/}}
{{- define "nvplugin.configKey" -}}
{{- $node := .cfg }}
{{- $walked := list }}
{{- $missing := false }}
{{- range (initial .path) }}
{{- $walked = append $walked . }}
{{- if not $missing }}
{{- if not (hasKey $node .) }}
{{- if $.set }}
{{- $_ := set $node . (dict) }}
{{- else }}
{{- $missing = true }}
{{- end }}
{{- end }}
{{- if not $missing }}
{{- $next := get $node . }}
{{- if not (kindIs "map" $next) }}
{{- fail (printf "values.config.%s must be a mapping, not %s" (join "." $walked) (toJson $next)) }}
{{- end }}
{{- $node = $next }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $missing }}
{{- $leaf := last .path }}
{{- if and (hasKey $node $leaf) (ne (toJson (get $node $leaf)) (toJson .value)) }}
{{- fail (printf "values.config.%s is %s but values.%s is %s: set it in one place (values.%s), the plugin reads one value" (join "." .path) (toJson (get $node $leaf)) .from (toJson .value) .from) }}
{{- end }}
{{- if .set }}
{{- $_ := set $node $leaf .value }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart values that are written into the config file (they have no flag or environment variable):
a list of [from, config path, value]; only the ones that are set.
*/}}
{{- define "nvplugin.fileSettings" -}}
{{- $out := list }}
{{- with .Values.deviceListStrategy }}
{{- $out = append $out (list "deviceListStrategy" (list "device_list_strategy") .) }}
{{- end }}
{{- with .Values.deviceIDStrategy }}
{{- $out = append $out (list "deviceIDStrategy" (list "device_id_strategy") .) }}
{{- end }}
{{- if not (kindIs "invalid" .Values.passDeviceSpecs) }}
{{- $out = append $out (list "passDeviceSpecs" (list "pass_device_specs") .Values.passDeviceSpecs) }}
{{- end }}
{{- $h := .Values.health }}
{{- if not (kindIs "invalid" $h.enabled) }}
{{- $out = append $out (list "health.enabled" (list "health" "enabled") $h.enabled) }}
{{- end }}
{{- with $h.ignoredXids }}
{{- $out = append $out (list "health.ignoredXids" (list "health" "xids" "ignore") .) }}
{{- end }}
{{- with $h.criticalXids }}
{{- $out = append $out (list "health.criticalXids" (list "health" "xids" "critical") .) }}
{{- end }}
{{- if not (kindIs "invalid" $h.recoveryQuietSeconds) }}
{{- $out = append $out (list "health.recoveryQuietSeconds" (list "health" "recovery" "quiet_s") $h.recoveryQuietSeconds) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Chart values that reach the plugin as flags or environment variables, which win over the config
file: [from, config path, value, variable], only the ones that are set.
*/}}
{{- define "nvplugin.flagSettings" -}}
{{- $out := list }}
{{- $out = append $out (list "resourceName" (list "resource_name") .Values.resourceName "NVPLUGIN_RESOURCE_NAME") }}
{{- $out = append $out (list "devicePluginPath" (list "device_plugin_dir") .Values.devicePluginPath "") }}
{{- with .Values.allocationPolicy }}
{{- $out = append $out (list "allocationPolicy" (list "allocation_policy") . "NVPLUGIN_ALLOCATION_POLICY") }}
{{- end }}
{{- if not (kindIs "invalid" .Values.failOnInitError) }}
{{- $out = append $out (list "failOnInitError" (list "fail_on_init_error") .Values.failOnInitError "NVPLUGIN_FAIL_ON_INIT_ERROR") }}
{{- end }}
{{- with .Values.log.format }}
{{- $out = append $out (list "log.format" (list "log" "format") . "NVPLUGIN_LOG_FORMAT") }}
{{- end }}
{{- with .Values.log.level }}
{{- $out = append $out (list "log.level" (list "log" "level") . "NVPLUGIN_LOG_LEVEL") }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- $out = append $out (list "metrics.port" (list "metrics_address") (printf "0.0.0.0:%d" (int .Values.metrics.port)) "NVPLUGIN_METRICS_ADDRESS") }}
{{- end }}
{{- if .Values.probes.enabled }}
{{- $out = append $out (list "probes.port" (list "health_probe_address") (printf "0.0.0.0:%d" (int .Values.probes.port)) "NVPLUGIN_HEALTH_PROBE_ADDRESS") }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Fail early on values that cannot work together. Included by every template that depends on them.
*/}}
{{- define "nvplugin.validate" -}}
{{- if and .Values.metrics.enabled .Values.probes.enabled (eq (int .Values.metrics.port) (int .Values.probes.port)) }}
{{- fail (printf "values.metrics.port and values.probes.port are both %d: the metrics and the health probes each need their own port" (int .Values.probes.port)) }}
{{- end }}
{{- if and (include "nvplugin.userConfigSet" .) .Values.existingConfigMap.name }}
{{- fail (printf "values.config and values.existingConfigMap.name (%q) are both set: the plugin reads one config file. Use values.config for a ConfigMap this chart manages, or existingConfigMap.name for one you manage, not both" .Values.existingConfigMap.name) }}
{{- end }}
{{- if .Values.existingConfigMap.name }}
{{- range (include "nvplugin.fileSettings" . | fromJsonArray) }}
{{- fail (printf "values.%s is set, but the config file comes from your ConfigMap %q: set %s there (the chart only writes config files it manages)" (index . 0) $.Values.existingConfigMap.name (join "." (index . 1))) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The plugin's config file (YAML) when this chart manages it: values.config, plus version: v1 when
missing, plus the file settings; checked against the flag settings.
*/}}
{{- define "nvplugin.configData" -}}
{{- include "nvplugin.validate" . }}
{{- $cfg := include "nvplugin.userConfig" . | fromJson }}
{{- if not (hasKey $cfg "version") }}
{{- $_ := set $cfg "version" "v1" }}
{{- end }}
{{- range (include "nvplugin.fileSettings" . | fromJsonArray) }}
{{- include "nvplugin.configKey" (dict "cfg" $cfg "from" (index . 0) "path" (index . 1) "value" (index . 2) "set" true) }}
{{- end }}
{{- range (include "nvplugin.flagSettings" . | fromJsonArray) }}
{{- include "nvplugin.configKey" (dict "cfg" $cfg "from" (index . 0) "path" (index . 1) "value" (index . 2) "set" false) }}
{{- end }}
{{- /* version first, as a person would write it; toYaml sorts the rest */}}
{{- $version := get $cfg "version" }}
{{- $rest := omit $cfg "version" }}
{{- dict "version" $version | toYaml }}
{{- if $rest }}
{{ toYaml $rest }}
{{- end }}
{{- end }}

{{/*
Changes whenever the config file changes, so the pods roll. For an existing ConfigMap the chart
can only see its content at install/upgrade time in a cluster (lookup; empty offline).
*/}}
{{- define "nvplugin.configChecksum" -}}
{{- if .Values.existingConfigMap.name }}
{{- $cm := lookup "v1" "ConfigMap" (include "nvplugin.namespace" .) .Values.existingConfigMap.name }}
{{- printf "%s/%s/%s" .Values.existingConfigMap.name .Values.existingConfigMap.key (toJson (dig "data" dict ($cm | default dict))) | sha256sum }}
{{- else }}
{{- include "nvplugin.configData" . | sha256sum }}
{{- end }}
{{- end }}

{{/*
One probe: the kubelet's httpGet on the plugin's health endpoint (container port "health").
/livez answers while the plugin's event loop turns; /readyz only while a resource is SERVING.
args: path, Values.
*/}}
{{- define "nvplugin.probe" -}}
httpGet:
  path: {{ .path }}
  port: health
timeoutSeconds: {{ .Values.probes.timeoutSeconds }}
{{- end }}
