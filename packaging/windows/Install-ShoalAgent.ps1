<#
.SYNOPSIS
    Installs shoal's agent for the user who is logged on (or removes it): the scheduled task that
    `shoal service install` registers, started at every logon in that user's session, hidden, at idle priority.

.DESCRIPTION
    For admins who deploy shoal to many PCs. Run it as the user, at logon: a Group Policy logon script
    (User Configuration > Policies > Windows Settings > Scripts (Logon/Logoff) > Logon), or an Intune
    platform script with "Run this script using the logged on credentials" set to Yes. Running it at every
    logon is safe: `shoal service install` is idempotent (it re-registers the same task and restarts the agent).

    It needs shoal installed for that user first (pipx install shoal, or the locked route of
    packaging/README.md). With -JoinToken it enrolls a PC that has no identity yet. It writes what it did to
    %LOCALAPPDATA%\shoal\logs\deploy.log; the agent's own log is agent.log beside it.

    The task is packaging/windows/shoal-agent.xml, filled in by `shoal service install` with this install's
    paths; this script only calls shoal.

.PARAMETER Shoal
    The shoal command (default: shoal.exe on PATH, else pipx's %USERPROFILE%\.local\bin\shoal.exe).

.PARAMETER JoinToken
    TOKEN@HOST:PORT, printed by `shoal fleet token` on the admin's PC: used only if this PC is not enrolled.

.PARAMETER Uninstall
    Stop the agent and remove what `shoal service install` wrote (the task, its XML, the settings file if
    nobody changed it).

.EXAMPLE
    powershell -NoProfile -ExecutionPolicy Bypass -File Install-ShoalAgent.ps1 -JoinToken 3f9a...@10.0.0.5:7300
#>
[CmdletBinding()]
param(
    [string]$Shoal,
    [string]$JoinToken,
    [switch]$Uninstall
)

$ErrorActionPreference = 'Stop'
$logFolder = Join-Path $env:LOCALAPPDATA 'shoal\logs'
New-Item -ItemType Directory -Force -Path $logFolder | Out-Null
$deployLog = Join-Path $logFolder 'deploy.log'

function Write-Log([string]$Message) {
    $line = '{0:u} {1}' -f (Get-Date), $Message
    Add-Content -Path $deployLog -Value $line
    Write-Output $line
}

function Invoke-Shoal([string[]]$Words, [switch]$MayFail) {
    Write-Log ('shoal ' + ($Words -join ' '))
    $output = & $Shoal @Words 2>&1
    $code = $LASTEXITCODE
    foreach ($line in $output) { Write-Log "  $line" }
    if ($code -ne 0 -and -not $MayFail) {
        Write-Log "failed (exit status $code)"
        exit $code
    }
    return $code
}

if (-not $Shoal) {
    $found = Get-Command 'shoal.exe' -ErrorAction SilentlyContinue
    $Shoal = if ($found) { $found.Source } else { Join-Path $env:USERPROFILE '.local\bin\shoal.exe' }
}
if (-not (Test-Path $Shoal)) {
    Write-Log "shoal is not installed for $env:USERNAME (no $Shoal): install it first (pipx install shoal)"
    exit 1
}

if ($Uninstall) {
    Invoke-Shoal @('service', 'uninstall') | Out-Null
    exit 0
}

# a PC that is not enrolled fails the dry run ("enroll it first"): join with the token, then install
if ((Invoke-Shoal @('service', 'install', '--dry-run') -MayFail) -ne 0) {
    if (-not $JoinToken) {
        Write-Log 'this PC is not enrolled and no -JoinToken was given: nothing installed'
        exit 1
    }
    Invoke-Shoal @('join', $JoinToken) | Out-Null
}
Invoke-Shoal @('service', 'install') | Out-Null
Invoke-Shoal @('service', 'status') -MayFail | Out-Null
exit 0
