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
`nvplugin serve` gives its socket (nvplugin/resourcenames.py: socket_name).
*/}}
{{- define "nvplugin.socketPath" -}}
{{- printf "%s/nvplugin-%s.sock" (trimSuffix "/" .Values.devicePluginPath) (last (splitList "/" .Values.resourceName)) }}
{{- end }}

{{- define "nvplugin.configDir" -}}/etc/nvplugin{{- end }}
{{- define "nvplugin.configFile" -}}config.yaml{{- end }}
{{- define "nvplugin.driverRoot" -}}/driver-root{{- end }}

{{- define "nvplugin.configMapName" -}}
{{- if .Values.config.name }}
{{- .Values.config.name }}
{{- else }}
{{- printf "%s-config" (include "nvplugin.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/*
One entry of config.map as a mapping: a mapping as given, a string parsed as YAML (or JSON).
args: name, value. Fails naming the entry when the string is not a YAML mapping.
*/}}
{{- define "nvplugin.parseConfig" -}}
{{- if kindIs "string" .value }}
{{- if not (trim .value) }}
{{- dict | toJson }}
{{- else }}
{{- $cfg := fromYaml .value }}
{{- if hasKey $cfg "Error" }}
{{- fail (printf "values.config.map.%s: not a YAML mapping (the plugin's config file): %s" .name (get $cfg "Error")) }}
{{- end }}
{{- $cfg | toJson }}
{{- end }}
{{- else }}
{{- .value | default dict | toJson }}
{{- end }}
{{- end }}

{{/*
The first problem of a value against a JSON Schema (the subset charts/generate_schema.py writes
from the plugin's config model: type, enum, pattern, minimum, maximum, properties,
additionalProperties false, required, items, minItems, uniqueItems, anyOf, and the plugin's
x-nvplugin-supported: the only values of an NVIDIA setting nvplugin accepts), or "" when it has
none. args: value, schema, path (the key path so far).
*/}}
{{- define "nvplugin.schemaError" -}}
{{- $v := .value }}
{{- $s := .schema }}
{{- $p := .path }}
{{- $err := "" }}
{{- $kind := "" }}
{{- if kindIs "invalid" $v }}{{ $kind = "null" }}
{{- else if kindIs "bool" $v }}{{ $kind = "boolean" }}
{{- else if kindIs "string" $v }}{{ $kind = "string" }}
{{- else if kindIs "map" $v }}{{ $kind = "object" }}
{{- else if kindIs "slice" $v }}{{ $kind = "array" }}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) }}{{ $kind = "integer" }}
{{- else if kindIs "float64" $v }}{{ $kind = ternary "integer" "number" (eq (floor $v) $v) }}
{{- end }}
{{- $where := ternary "" (printf "key %q: " $p) (eq $p "") }}
{{- if hasKey $s "anyOf" }}
{{- $ok := false }}
{{- $first := "" }}
{{- range $s.anyOf }}
{{- if not $ok }}
{{- $e := include "nvplugin.schemaError" (dict "value" $v "schema" . "path" $p) }}
{{- if not $e }}{{ $ok = true }}{{ else if not $first }}{{ $first = $e }}{{ end }}
{{- end }}
{{- end }}
{{- if not $ok }}{{ $err = $first }}{{ end }}
{{- end }}
{{- if and (not $err) (hasKey $s "type") }}
{{- $types := $s.type }}
{{- if kindIs "string" $types }}{{ $types = list $types }}{{ end }}
{{- if not (or (has $kind $types) (and (eq $kind "integer") (has "number" $types))) }}
{{- $err = printf "%sexpected %s, got %s %s" $where (join " or " $types) $kind (toJson $v | trunc 80) }}
{{- end }}
{{- end }}
{{- if and (not $err) (hasKey $s "enum") (not (has (toJson $v) (without (splitList "\n" (include "nvplugin.jsonLines" $s.enum)) ""))) }}
{{- $err = printf "%s%s is not one of %s" $where (toJson $v | trunc 80) (join ", " $s.enum) }}
{{- end }}
{{- if and (not $err) (eq $kind "string") (hasKey $s "pattern") (not (regexMatch $s.pattern $v)) }}
{{- $err = printf "%s%s does not match %s" $where (toJson $v | trunc 80) $s.pattern }}
{{- end }}
{{- if and (not $err) (or (eq $kind "integer") (eq $kind "number")) }}
{{- if and (hasKey $s "minimum") (lt (float64 $v) (float64 $s.minimum)) }}
{{- $err = printf "%s%v is less than %v" $where $v $s.minimum }}
{{- else if and (hasKey $s "maximum") (gt (float64 $v) (float64 $s.maximum)) }}
{{- $err = printf "%s%v is more than %v" $where $v $s.maximum }}
{{- end }}
{{- end }}
{{- if and (not $err) (eq $kind "object") (hasKey $s "properties") }}
{{- $props := $s.properties }}
{{- range $key := keys $v | sortAlpha }}
{{- if not $err }}
{{- $sub := ternary $key (printf "%s.%s" $p $key) (eq $p "") }}
{{- if hasKey $props $key }}
{{- $err = include "nvplugin.schemaError" (dict "value" (get $v $key) "schema" (get $props $key) "path" $sub) }}
{{- else if eq (toJson (get $s "additionalProperties")) "false" }}
{{- $err = printf "unknown key %q; valid keys here: %s" $sub (join ", " (keys $props | sortAlpha)) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $s.required }}
{{- if and (not $err) (not (hasKey $v .)) }}
{{- $err = printf "key %q: is missing" (ternary . (printf "%s.%s" $p .) (eq $p "")) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not $err) (eq $kind "array") }}
{{- if and (hasKey $s "minItems") (lt (len $v) (int $s.minItems)) }}
{{- $err = printf "%sexpected at least %v item(s)" $where $s.minItems }}
{{- else if and (hasKey $s "uniqueItems") $s.uniqueItems (ne (len $v) (len (uniq $v))) }}
{{- $err = printf "%sa value is listed twice" $where }}
{{- end }}
{{- if and (not $err) (hasKey $s "items") }}
{{- range $i, $item := $v }}
{{- if not $err }}
{{- $err = include "nvplugin.schemaError" (dict "value" $item "schema" $s.items "path" (printf "%s[%d]" $p $i)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not $err) (hasKey $s "x-nvplugin-supported") }}
{{- if not (has (toJson $v) (without (splitList "\n" (include "nvplugin.jsonLines" (get $s "x-nvplugin-supported"))) "")) }}
{{- $err = printf "%s%s" $where (get $s "x-nvplugin-unsupported") }}
{{- end }}
{{- end }}
{{- $err }}
{{- end }}

{{/* Each item of a list as JSON, one per line (to compare values whatever their number types). */}}
{{- define "nvplugin.jsonLines" -}}
{{- range . }}
{{ toJson . }}
{{- end }}
{{- end }}

{{/*
config.map checked: every entry against the plugin's config schema (config.schema.json, written
from the plugin's config model by charts/generate_schema.py). Returns the entries as
{name: YAML text}.
*/}}
{{- define "nvplugin.configEntries" -}}
{{- $schema := .Files.Get "config.schema.json" | fromJson }}
{{- $out := dict }}
{{- range $name, $value := .Values.config.map }}
{{- $cfg := include "nvplugin.parseConfig" (dict "name" $name "value" $value) | fromJson }}
{{- $err := include "nvplugin.schemaError" (dict "value" $cfg "schema" $schema "path" "") }}
{{- if $err }}
{{- fail (printf "values.config.map.%s: %s (nvplugin's config file: NVIDIA's v1 format plus nvplugin's keys)" $name $err) }}
{{- end }}
{{- $_ := set $out $name (ternary $value (toYaml $value) (kindIs "string" $value)) }}
{{- end }}
{{- $out | toJson }}
{{- end }}

{{/*
The config file every node uses: its key in the ConfigMap, or "" for none. config.default when
set, else NVIDIA's fallback strategies in order: named (the entry "default"), single (the only
entry), empty (no config file). With config.name the chart sees the ConfigMap's keys only in a
cluster (lookup); offline it takes "default" for named.
*/}}
{{- define "nvplugin.configKey" -}}
{{- $keys := list }}
{{- $known := true }}
{{- if .Values.config.name }}
{{- $cm := lookup "v1" "ConfigMap" (include "nvplugin.namespace" .) .Values.config.name }}
{{- if $cm }}{{ $keys = keys ($cm.data | default dict) | sortAlpha }}{{ else }}{{ $known = false }}{{ end }}
{{- else }}
{{- $keys = keys .Values.config.map | sortAlpha }}
{{- end }}
{{- $chosen := "" }}
{{- $done := false }}
{{- if .Values.config.default }}
{{- if and $known (not (has .Values.config.default $keys)) }}
{{- fail (printf "values.config.default is %q, but the config files are: %s" .Values.config.default (join ", " $keys)) }}
{{- end }}
{{- $chosen = .Values.config.default }}
{{- $done = true }}
{{- end }}
{{- range .Values.config.fallbackStrategies }}
{{- if not $done }}
{{- if and (eq . "named") (or (has "default" $keys) (not $known)) }}
{{- $chosen = "default" }}{{ $done = true }}
{{- else if and (eq . "single") (eq (len $keys) 1) }}
{{- $chosen = first $keys }}{{ $done = true }}
{{- else if eq . "empty" }}
{{- $done = true }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not $done) (or $keys .Values.config.name) }}
{{- fail (printf "values.config: no config file chosen from %s: set config.default (fallbackStrategies %s found none)" (join ", " $keys) (toJson .Values.config.fallbackStrategies)) }}
{{- end }}
{{- $chosen }}
{{- end }}

{{/*
The chart values that set the plugin's settings, and how each reaches the plugin: settings.json,
written from the settings' declarations (nvplugin/config/model.py) by charts/generate_schema.py.
"args": values passed as a serve flag; "env": values passed as an environment variable ("to":
env = the value, a list joined with commas; true = "true" when true; address = 0.0.0.0:<port>
while <x>.enabled; when = the entry's constant when true); "refused": NVIDIA values nvplugin
accepts at some values only.
*/}}
{{- define "nvplugin.settings" -}}
{{- .Files.Get "settings.json" }}
{{- end }}

{{/*
The feature file the plugin writes the node's labels to with gfd.enabled (settings.json, from the
declaration of flags.gfd.outputFile); the chart mounts its directory from the host.
*/}}
{{- define "nvplugin.featureFile" -}}
{{- range (include "nvplugin.settings" . | fromJson).env }}
{{- if eq .setting "flags.gfd.outputFile" }}{{ .constant }}{{ end }}
{{- end }}
{{- end }}

{{- define "nvplugin.labelling" -}}
{{- if (.Values.gfd | default dict).enabled }}true{{ end }}
{{- end }}

{{/*
A chart value by its path (["log", "level"]), as {"v": value}; "" when it is absent. args: Values,
path.
*/}}
{{- define "nvplugin.value" -}}
{{- $v := .Values }}
{{- range .path }}{{ $v = get (ternary $v dict (kindIs "map" $v)) . }}{{ end }}
{{- dict "v" $v | toJson }}
{{- end }}

{{/* Whether a value is set: not null, "" or []. args: the value. */}}
{{- define "nvplugin.isSet" -}}
{{- if not (has (toJson .) (list "null" "\"\"" "[]")) }}true{{ end }}
{{- end }}

{{/*
NVIDIA values nvplugin cannot honour fail rendering, saying so.
*/}}
{{- define "nvplugin.validate" -}}
{{- if and .Values.metrics.enabled .Values.probes.enabled (eq (int .Values.metrics.port) (int .Values.probes.port)) }}
{{- fail (printf "values.metrics.port and values.probes.port are both %d: the metrics and the health probes each need their own port" (int .Values.probes.port)) }}
{{- end }}
{{- if and .Values.config.name .Values.config.map }}
{{- fail (printf "values.config.name (%q) and values.config.map are both set: the plugin reads config files from one ConfigMap; use config.map for one this chart manages, or config.name for yours" .Values.config.name) }}
{{- end }}
{{- range $key := keys (.Values.gfd | default dict) | sortAlpha }}
{{- if not (has $key (list "enabled" "noTimestamp" "sleepInterval")) }}
{{- fail (printf "values.gfd.%s: nvplugin's chart deploys no GPU Feature Discovery DaemonSet: gfd.enabled makes the plugin pod label its node itself; remove gfd.%s" $key $key) }}
{{- end }}
{{- end }}
{{- range $name := list "nfd" "mps" }}
{{- if get $.Values $name }}
{{- fail (printf "values.%s: nvplugin's chart does not deploy %s; remove the %s values (Node Feature Discovery and MPS are not part of nvplugin)" $name $name $name) }}
{{- end }}
{{- end }}
{{- range (include "nvplugin.settings" . | fromJson).refused }}
{{- $v := (include "nvplugin.value" (dict "Values" $.Values "path" .value) | fromJson).v }}
{{- if and (include "nvplugin.isSet" $v) (not (has (toJson $v) .supported)) }}
{{- $shown := ternary (printf "%q" $v) (toJson $v) (kindIs "string" $v) }}
{{- fail (printf "values.%s: %s" (join "." .value) (replace "{value}" $shown .message)) }}
{{- end }}
{{- end }}
{{- range .Values.config.fallbackStrategies }}
{{- if not (has . (list "named" "single" "empty")) }}
{{- fail (printf "values.config.fallbackStrategies: %q needs NVIDIA's config manager (per-node selection by node label), which nvplugin's chart does not run" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart values that reach the plugin as environment variables (which win over the config file):
[name, value], only the ones that are set, in the settings' order (settings.json "env").
NVIDIA's values use NVIDIA's variable names.
*/}}
{{- define "nvplugin.env" -}}
{{- $out := list }}
{{- range (include "nvplugin.settings" . | fromJson).env }}
{{- $v := (include "nvplugin.value" (dict "Values" $.Values "path" (index .values 0)) | fromJson).v }}
{{- if eq .to "address" }}
{{- if $v }}
{{- $port := (include "nvplugin.value" (dict "Values" $.Values "path" (index .values 1)) | fromJson).v }}
{{- $out = append $out (list .env (printf "0.0.0.0:%d" (int $port))) }}
{{- end }}
{{- else if eq .to "true" }}
{{- if eq (toJson $v) "true" }}{{ $out = append $out (list .env "true") }}{{ end }}
{{- else if eq .to "when" }}
{{- if eq (toJson $v) "true" }}{{ $out = append $out (list .env .constant) }}{{ end }}
{{- else if include "nvplugin.isSet" $v }}
{{- $out = append $out (list .env (ternary (join "," $v) $v (kindIs "slice" $v))) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Chart values that reach the plugin as serve flags: [flag, value], only the ones that are set.
*/}}
{{- define "nvplugin.args" -}}
{{- $out := list }}
{{- range (include "nvplugin.settings" . | fromJson).args }}
{{- $v := (include "nvplugin.value" (dict "Values" $.Values "path" .value) | fromJson).v }}
{{- if include "nvplugin.isSet" $v }}{{ $out = append $out (list .flag $v) }}{{ end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Whether the container must be privileged: DeviceSpecs (compatWithCPUManager, or passDeviceSpecs in
the chosen config file) name host device nodes only a privileged container sees, and with the
driver mounted from the host but no NVIDIA runtime, NVML needs the /dev/nvidia* nodes.
*/}}
{{- define "nvplugin.privileged" -}}
{{- $key := include "nvplugin.configKey" . }}
{{- $specs := false }}
{{- if and $key (hasKey .Values.config.map $key) }}
{{- $cfg := include "nvplugin.parseConfig" (dict "name" $key "value" (get .Values.config.map $key)) | fromJson }}
{{- $specs = eq (toJson (dig "flags" "plugin" "passDeviceSpecs" false $cfg)) "true" }}
{{- end }}
{{- if or .Values.compatWithCPUManager $specs (and .Values.nvidiaDriverRoot (not .Values.runtimeClassName)) }}true{{ end }}
{{- end }}

{{/*
Changes whenever the config files change, so the pods roll. For an existing ConfigMap the chart
can only see its content at install/upgrade time in a cluster (lookup; empty offline).
*/}}
{{- define "nvplugin.configChecksum" -}}
{{- if .Values.config.name }}
{{- $cm := lookup "v1" "ConfigMap" (include "nvplugin.namespace" .) .Values.config.name }}
{{- printf "%s/%s/%s" .Values.config.name (include "nvplugin.configKey" .) (toJson (dig "data" dict ($cm | default dict))) | sha256sum }}
{{- else }}
{{- printf "%s/%s" (include "nvplugin.configKey" .) (include "nvplugin.configEntries" .) | sha256sum }}
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
